/**
 * The reservation lifecycle as pure transitions: given what PostgreSQL says now (a snapshot) and
 * what the workflow was asked since its last look (intents), answer the one action to take next, or
 * when to look again. No I/O and no clock of its own (the snapshot carries compute_now()), so the
 * workflow can run it deterministically and tests can run it without Temporal.
 */

import { dueRepairMoment } from './booking-repair.ts';
import { assertNever } from './errors.ts';
import { gangBindingAction } from './gang-lifecycle.ts';
import { decideReleasing } from './kubernetes-release.ts';
import { activeConditions, sameConditions } from './reservation-lifecycle-conditions.ts';
import type {
  LifecycleAction,
  LifecycleIntents,
  LifecycleMemory,
  ReservationSnapshot,
} from './reservation-lifecycle-types.ts';

export * from './reservation-lifecycle-conditions.ts';
export * from './reservation-lifecycle-types.ts';

/** The earliest of `fallback` and the moments that are set. */
function earliest(fallback: number, ...moments: Array<number | null | undefined>): number {
  const set = moments.filter((m): m is number => typeof m === 'number' && Number.isFinite(m));
  return Math.min(fallback, ...set);
}

/** An allocation the node should hold whose NodeSpec assignment ends elsewhere (an extend moved it). */
function assignmentsStale(s: ReservationSnapshot): boolean {
  return s.allocations.some(
    (a) =>
      a.until !== undefined &&
      a.assignedUntil !== undefined &&
      a.assignedUntil !== null &&
      (a.state === 'binding' || a.state === 'bound') &&
      a.assignedUntil !== a.until,
  );
}

/** The start of the usage window after the one holding `at`. */
export function nextWindowStart(at: number, windowMs: number): number {
  return (Math.floor(at / windowMs) + 1) * windowMs;
}

function endFor(s: ReservationSnapshot, intents: LifecycleIntents): LifecycleAction | null {
  if (intents.release) return { kind: 'end', state: 'released', reason: 'release' };
  if (s.leaseExpiresAt !== null && s.now >= s.leaseExpiresAt) {
    return { kind: 'end', state: 'released', reason: 'lease-lapsed' };
  }
  if (s.preemptAt !== undefined && s.now >= s.preemptAt) {
    // The preemption workflow releases it at the deadline; its own lifecycle only backs that up.
    if (s.now >= s.preemptAt + preemptionBackstopMs) {
      return { kind: 'end', state: 'released', reason: 'preempted' };
    }
    return { kind: 'wait', until: s.preemptAt + preemptionBackstopMs, reason: 'preemption' };
  }
  if (s.end !== null && s.now >= s.end) return { kind: 'end', state: 'released', reason: 'expired' };
  return null;
}

/** How long after a spot reservation's notice deadline its lifecycle releases it, should the preemption workflow not have. */
export const preemptionBackstopMs = 60_000;

/** A pending or placed reservation whose pool was archived or withdrawn from its tenant fails. */
function poolGone(): LifecycleAction {
  return {
    kind: 'end',
    state: 'failed',
    reason: 'pool-gone',
    condition: {
      type: 'Unschedulable',
      reason: 'PoolGone',
      message: 'the pool is archived or no longer offered to the tenant; reserve in another pool',
    },
  };
}

/**
 * A failed binding attempt: `rebind` (pending again, every booking released) or, at the last
 * attempt, `end` as failed. `detail` replaces the default account of what went wrong.
 */
export function bindFailure(
  s: ReservationSnapshot,
  reason: 'NodeDidNotBind' | 'NodeRejectedBinding',
  detail?: string,
): LifecycleAction {
  const failures = s.bindAttempts + 1;
  const what = reason === 'NodeDidNotBind' ? 'did not bind in time' : 'refused the binding';
  const message = `${detail ?? `the node ${what}`} (attempt ${failures} of ${s.timers.maxBindFailures})`;
  if (failures >= s.timers.maxBindFailures) {
    return {
      kind: 'end',
      state: 'failed',
      reason: 'bind-timeout',
      condition: { type: 'BindTimeout', reason, message },
    };
  }
  return { kind: 'rebind', reason, message };
}

/**
 * The next action for a reservation. Level-triggered: it reads only the snapshot, the intents and
 * the memory, so calling it again after any wake-up is always safe. A `wait` names the moment the
 * workflow must look again even if nothing wakes it.
 */
export function decide(
  s: ReservationSnapshot,
  intents: LifecycleIntents,
  memory: LifecycleMemory,
): LifecycleAction {
  const t = s.timers;
  const recheck = s.now + t.recheckMs;
  switch (s.state) {
    case 'denied':
    case 'released':
    case 'failed':
    case 'cancelled':
    case 'expired':
    case 'draft':
      return { kind: 'finish' };
    case 'releasing':
      // Only a kubernetes binding whose pods still hold its GPUs is ever releasing.
      return decideReleasing(s, nextWindowStart(memory.meteredThrough ?? s.now, t.usageWindowMs));
    case 'awaiting-confirmation': {
      if (intents.cancel || intents.release) return { kind: 'end', state: 'cancelled', reason: 'cancel' };
      if (intents.confirmation === 'denied')
        return { kind: 'end', state: 'denied', reason: 'confirmation-denied' };
      if (s.confirmationExpiresAt !== null && s.now >= s.confirmationExpiresAt) {
        return { kind: 'end', state: 'expired', reason: 'confirmation-expired' };
      }
      return { kind: 'wait', until: earliest(recheck, s.confirmationExpiresAt), reason: 'confirmation' };
    }
    case 'pending': {
      if (intents.cancel || intents.release) return { kind: 'end', state: 'cancelled', reason: 'cancel' };
      if (!s.poolAvailable) return poolGone();
      const pendingSince = s.pendingSince ?? s.now;
      const maxPendingAt = pendingSince + t.maxPendingMs;
      if (s.now >= maxPendingAt) {
        return {
          kind: 'end',
          state: 'failed',
          reason: 'max-pending-exceeded',
          condition: {
            type: 'Unschedulable',
            reason: 'MaxPendingExceeded',
            message: `pending longer than the pool's maxPending of ${t.maxPendingMs} ms`,
          },
        };
      }
      // Queued for the pool-lease placer: its batch places it and wakes this lifecycle.
      if (s.conditions.some((c) => c.type === 'Queued'))
        return { kind: 'wait', until: earliest(recheck, maxPendingAt), reason: 'queued' };
      const nextTry =
        memory.lastPlaceAttemptAt === null ? s.now : memory.lastPlaceAttemptAt + t.pendingRetryMs;
      if (intents.capacityFreed || s.now >= nextTry) return { kind: 'place' };
      return { kind: 'wait', until: earliest(recheck, nextTry, maxPendingAt), reason: 'pending-retry' };
    }
    case 'placed': {
      if (intents.cancel) return { kind: 'end', state: 'cancelled', reason: 'cancel' };
      // Archived or withdrawn before the start: the booking goes; once binding, it runs to its end.
      if (!s.poolAvailable) return poolGone();
      const ending = endFor(s, intents);
      if (ending) return ending;
      const start = s.start ?? s.now;
      // A calendar reservation's bookings are checked (and repaired) before it binds.
      const repair = dueRepairMoment(s, t.preStartMs, memory.repairsDone ?? []);
      if (repair) return { kind: 'repairBookings', moment: repair };
      if (s.now >= start) return { kind: 'beginBinding', bindDeadline: s.now + t.bindTimeoutMs };
      const preStart = start - t.preStartMs > s.now ? start - t.preStartMs : null;
      return {
        kind: 'wait',
        until: earliest(recheck, preStart, start, s.leaseExpiresAt, s.end),
        reason: 'start',
      };
    }
    case 'binding': {
      const ending = endFor(s, intents);
      if (ending) return ending;
      if (s.allocations.length === 0) return bindFailure(s, 'NodeRejectedBinding');
      const gang = gangBindingAction(s, bindFailure);
      if (gang) return gang;
      if (
        s.allocations.some((a) => a.state === 'failed' || a.state === 'released' || a.state === 'releasing')
      ) {
        return bindFailure(s, 'NodeRejectedBinding');
      }
      if (assignmentsStale(s)) return { kind: 'syncAssignments' };
      if (s.allocations.every((a) => a.state === 'bound')) return { kind: 'activate' };
      const deadline = s.bindDeadline ?? s.now + t.bindTimeoutMs;
      if (s.now >= deadline) return bindFailure(s, 'NodeDidNotBind');
      return {
        kind: 'wait',
        until: earliest(recheck, deadline, s.leaseExpiresAt, s.end),
        reason: 'bind-deadline',
      };
    }
    case 'active': {
      const ending = endFor(s, intents);
      if (ending) return ending;
      if (assignmentsStale(s)) return { kind: 'syncAssignments' };
      const wanted = activeConditions(s);
      if (!sameConditions(wanted, s.conditions)) return { kind: 'setConditions', conditions: wanted };
      const meteredThrough = memory.meteredThrough ?? s.now;
      const nextWindow = nextWindowStart(meteredThrough, t.usageWindowMs);
      if (s.now >= nextWindow) return { kind: 'meterUsage' };
      return {
        kind: 'wait',
        until: earliest(recheck, nextWindow, s.leaseExpiresAt, s.end),
        reason: 'active',
      };
    }
    default:
      return assertNever(s.state);
  }
}
