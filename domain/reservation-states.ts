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
