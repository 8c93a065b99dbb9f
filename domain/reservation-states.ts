/**
 * The one closed set of reservation states, and the groups of them the code asks about. Every
 * question about a state ("may it still be cancelled?", "does a lifecycle run for it?") is a
 * predicate here, and every SQL `in` filter takes the matching `as const` subset: no list of
 * states is written anywhere else.
 */

/** Every state a reservation can be in; `denied`, `released`, `failed`, `cancelled` and `expired` are terminal. */
export const reservationStates = [
  'draft',
  'denied',
  'awaiting-confirmation',
  'pending',
  'placed',
  'binding',
  'active',
  'releasing',
  'released',
  'failed',
  'cancelled',
  'expired',
] as const;

export type ReservationState = (typeof reservationStates)[number];

/** The states callers can see: drafts are internal (NOT_FOUND to `get`, absent from `list`). */
export const visibleReservationStates = reservationStates.filter(
  (state): state is Exclude<ReservationState, 'draft'> => state !== 'draft',
) as [Exclude<ReservationState, 'draft'>, ...Exclude<ReservationState, 'draft'>[]];

/** Final: nothing changes a reservation in one of these again, and its lifecycle finishes. */
export const terminalStates = [
  'denied',
  'released',
  'failed',
  'cancelled',
  'expired',
] as const satisfies readonly ReservationState[];

export type TerminalState = (typeof terminalStates)[number];

/**
 * The terminal states but `denied`: how the queries that settle allocations and usage say "ended".
 * A denied reservation never held an allocation, so for them this reads the same as `terminalStates`.
 */
export const endedStates = [
  'released',
  'cancelled',
  'expired',
  'failed',
] as const satisfies readonly TerminalState[];

/** Past its draft and not yet terminal: a lifecycle workflow must be running for it. */
export const liveStates = [
  'awaiting-confirmation',
  'pending',
  'placed',
  'binding',
  'active',
  'releasing',
] as const satisfies readonly ReservationState[];

/** Admission has not decided it yet: a refusal or a confirmation hold can still be recorded. */
export const undecidedStates = [
  'draft',
  'awaiting-confirmation',
] as const satisfies readonly ReservationState[];

/**
 * What a refused request leaves behind, never placed: a draft admission left (QUOTA_EXCEEDED,
 * SPEND_LIMIT_REACHED), a denial, an expired confirmation. The draft cleanup removes them after
 * their retention.
 */
export const refusedStates = ['draft', 'denied', 'expired'] as const satisfies readonly ReservationState[];

/** Not started yet: a cancel still applies (it becomes `cancelled`, no usage is billed). */
export const cancellableStates = [
  'pending',
  'placed',
  'awaiting-confirmation',
] as const satisfies readonly ReservationState[];

/**
 * Placed and not being released: it holds its booked capacity. Its lease renews, its end extends,
 * and a change on one of its nodes concerns its lifecycle.
 */
export const holdingStates = ['placed', 'binding', 'active'] as const satisfies readonly ReservationState[];

/** Placed and not yet ended (`releasing` included): ending it releases rather than cancels it. */
export const placedStates = [
  'placed',
  'binding',
  'active',
  'releasing',
] as const satisfies readonly ReservationState[];

/** The membership test of one state group, as a predicate over any stored state string. */
function memberOf(states: readonly ReservationState[]): (state: string) => boolean {
  return (state) => (states as readonly string[]).includes(state);
}

/** Whether the state is final (`terminalStates`). */
export const isTerminal = memberOf(terminalStates);

/** Whether a lifecycle workflow must be running for a reservation in this state (`liveStates`). */
export const isLive = memberOf(liveStates);

/** Whether admission may still record its decision (`undecidedStates`). */
export const isUndecided = memberOf(undecidedStates);

/** Whether a cancel still applies: the reservation has not started (`cancellableStates`). */
export const isCancellable = memberOf(cancellableStates);

/** Whether the reservation has not started: no node has been asked to bind it (`cancellableStates`). */
export const isUnstarted = memberOf(cancellableStates);

/** Whether the lease renews (`holdingStates`). */
export const isRenewable = memberOf(holdingStates);

/** Whether the end may move later (`holdingStates`). */
export const isExtendable = memberOf(holdingStates);

/** Whether the reservation was placed and has not ended (`placedStates`). */
export const isPlaced = memberOf(placedStates);
