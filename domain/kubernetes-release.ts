/**
 * The release of a `kubernetes`-bound reservation, as pure rules. Releasing withdraws the GPUs
 * from bcd's device plugin at once, but pods the kubelet already gave them to keep running: until
 * the node reports them free, the allocation stays `releasing`, the reservation is `releasing`
 * with `DevicesHeld`/`PodsHoldDevices`, and the GPUs stay booked. Billing never runs past the
 * allocation's own end; a release still held at that end is carried in 5-minute steps (the
 * booking's upper bound moves, unbilled) for at most 24 hours, then force-released.
 */

import type {
  AllocationView,
  Condition,
  LifecycleAction,
  ReservationSnapshot,
} from './reservation-lifecycle-types.ts';

/** How far one carry moves a held booking's upper bound past the allocation's end. */
export const releaseCarryStepMs = 5 * 60_000;
/** How long past the allocation's end a held release is carried before it is forced. */
export const releaseCarryLimitMs = 24 * 3_600_000;
/** How long before a held booking runs out it is carried (so nothing else is booked into the gap). */
export const releaseCarryLeadMs = 60_000;

/** Why a held release was ended without the node reporting the GPUs free (24 hours past the end, or the carried span was booked). */
export type ForcedReleaseReason = NonNullable<Extract<LifecycleAction, { kind: 'finishRelease' }>['forced']>;

/** The condition of a reservation whose pods still hold its GPUs, since its release began. */
export function devicesHeldCondition(nodeIds: readonly string[], since: number): Condition {
  const nodes = [...new Set(nodeIds)].sort();
  return {
    type: 'DevicesHeld',
    reason: 'PodsHoldDevices',
    message: `pods on ${nodes.join(', ')} still hold its GPUs: they stay booked (billed at most to the reservation's end) until the node reports them free; delete the pods to finish the release`,
    since,
  };
}

/** The allocations whose release waits for the node (pods may still hold their GPUs). */
export function heldAllocations(s: ReservationSnapshot): AllocationView[] {
  return s.allocations.filter((a) => a.state === 'releasing');
}

/** The moment a held release is forced: 24 hours past the latest held allocation's own end. */
export function releaseCarryLimitAt(held: readonly AllocationView[], now: number): number {
  return Math.max(...held.map((a) => a.until ?? now)) + releaseCarryLimitMs;
}

/**
 * The next step of a `releasing` reservation: finish once no allocation is held any more (the
 * node reported the GPUs free); force the finish at the carry limit; carry the bookings when the
 * earliest held one is within a minute of running out; otherwise wait for that moment, the limit,
 * the next billing window or the recheck. `nextWindow` is when usage is metered next.
 */
export function decideReleasing(s: ReservationSnapshot, nextWindow: number): LifecycleAction {
  const held = heldAllocations(s);
  if (held.length === 0) return { kind: 'finishRelease', forced: null };
  const limitAt = releaseCarryLimitAt(held, s.now);
  if (s.now >= limitAt) return { kind: 'finishRelease', forced: 'carry-limit' };
  const bookedUntil = Math.min(...held.map((a) => a.bookedUntil ?? a.until ?? s.now));
  const carryAt = bookedUntil < limitAt ? bookedUntil - releaseCarryLeadMs : null;
  if (carryAt !== null && s.now >= carryAt) {
    return {
      kind: 'carryRelease',
      until: Math.min(Math.max(bookedUntil, s.now) + releaseCarryStepMs, limitAt),
    };
  }
  if (s.now >= nextWindow) return { kind: 'meterUsage' };
  return {
    kind: 'wait',
    until: Math.min(s.now + s.timers.recheckMs, limitAt, nextWindow, ...(carryAt === null ? [] : [carryAt])),
    reason: 'devices-held',
  };
}
