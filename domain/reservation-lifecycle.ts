/**
 * The reservation lifecycle as pure transitions: given what PostgreSQL says now (a snapshot) and
 * what the workflow was asked since its last look (intents), answer the one action to take next, or
 * when to look again. No I/O and no clock of its own (the snapshot carries compute_now()), so the
 * workflow can run it deterministically and tests can run it without Temporal.
 */

export type LifecycleState =
  | 'draft'
  | 'denied'
  | 'awaiting-confirmation'
  | 'pending'
  | 'placed'
  | 'binding'
  | 'active'
  | 'releasing'
  | 'released'
  | 'failed'
  | 'cancelled'
  | 'expired';

export const terminalStates: readonly LifecycleState[] = [
  'denied',
  'released',
  'failed',
  'cancelled',
  'expired',
];

export function isTerminal(state: string): boolean {
  return (terminalStates as readonly string[]).includes(state);
}

/** Every moment the lifecycle owns, in milliseconds. Pool policy `timers` and workflow input override. */
export interface LifecycleTimers {
  /** How long a node has to report every allocation bound (5 minutes). */
  bindTimeoutMs: number;
  /** How often a pending reservation tries to place again (30 seconds). */
  pendingRetryMs: number;
  /** How long a reservation may stay pending before it fails (the pool's `maxPending`, 24 hours). */
  maxPendingMs: number;
  /** The look taken before a future start (15 minutes before it). */
  preStartMs: number;
  /** The longest the workflow sleeps without a reason (15 minutes). */
  recheckMs: number;
  /** How many binding failures end the reservation (3: placed again at most twice). */
  maxBindFailures: number;
  /** The billing window (an hour). */
  usageWindowMs: number;
}

export const defaultTimers: LifecycleTimers = {
  bindTimeoutMs: 5 * 60_000,
  pendingRetryMs: 30_000,
  maxPendingMs: 24 * 3_600_000,
  preStartMs: 15 * 60_000,
  recheckMs: 15 * 60_000,
  maxBindFailures: 3,
  usageWindowMs: 3_600_000,
};

export interface Condition {
  type: string;
  reason: string;
  message: string;
  since?: number;
}

export interface AllocationView {
  id: string;
  nodeId: string;
  state: 'planned' | 'binding' | 'bound' | 'releasing' | 'released' | 'failed';
  boundAt: number | null;
  /** A later report of this bound allocation failed verification: its binding is not trusted. */
  bindingLost?: boolean;
  /** The node is not connected (its session ended or its lease ran out). */
  nodeUnreachable?: boolean;
  /** The node reports something besides bcd can hand its GPUs to pods. */
  foreignGpuExposure?: boolean;
  /** Booked atoms that are unhealthy (stable ids). */
  unhealthyAtoms?: string[];
}

/** What PostgreSQL says about one reservation, all times epoch milliseconds of compute_now(). */
export interface ReservationSnapshot {
  id: string;
  tenantId: string;
  poolId: string;
  state: LifecycleState;
  version: number;
  now: number;
  start: number | null;
  end: number | null;
  leaseSeconds: number | null;
  leaseExpiresAt: number | null;
  bindAttempts: number;
  bindDeadline: number | null;
  pendingSince: number | null;
  confirmationExpiresAt: number | null;
  endReason: string | null;
  conditions: Condition[];
  /** The current placement's allocations (not those released by an earlier attempt). */
  allocations: AllocationView[];
  /** False once the pool is archived or no longer offered to the tenant. */
  poolAvailable: boolean;
  timers: LifecycleTimers;
  /** What the reservation is, for the workflow's memo. */
  summary: string;
}

/** What the workflow was asked since it last acted (signals and updates set these). */
export interface LifecycleIntents {
  release: boolean;
  cancel: boolean;
  confirmation: 'approved' | 'denied' | null;
  /** Capacity was freed in the pool: try placing now rather than at the next retry. */
  capacityFreed: boolean;
}

/** What the workflow remembers between looks (carried across continue-as-new). */
export interface LifecycleMemory {
  /** compute_now() of the last placement attempt of a pending reservation. */
  lastPlaceAttemptAt: number | null;
  /** compute_now() up to which usage has been metered. */
  meteredThrough: number | null;
}

export type EndState = 'released' | 'cancelled' | 'failed' | 'expired' | 'denied';

export type LifecycleAction =
  | { kind: 'finish' }
  | { kind: 'wait'; until: number; reason: string }
  | { kind: 'place' }
  | { kind: 'beginBinding'; bindDeadline: number }
  | { kind: 'activate' }
  | { kind: 'rebind'; reason: 'NodeDidNotBind' | 'NodeRejectedBinding'; message: string }
  | { kind: 'end'; state: EndState; reason: string; condition?: Condition }
  | { kind: 'setConditions'; conditions: Condition[] }
  | { kind: 'meterUsage' };

const degradedLost: Condition = {
  type: 'Degraded',
  reason: 'BindingLost',
  message: 'a node reported it lost devices it had bound',
};

/** The earliest of `fallback` and the moments that are set. */
function earliest(fallback: number, ...moments: Array<number | null | undefined>): number {
  const set = moments.filter((m): m is number => typeof m === 'number' && Number.isFinite(m));
  return Math.min(fallback, ...set);
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
  if (s.end !== null && s.now >= s.end) return { kind: 'end', state: 'released', reason: 'expired' };
  return null;
}

function bindFailure(
  s: ReservationSnapshot,
  reason: 'NodeDidNotBind' | 'NodeRejectedBinding',
): LifecycleAction {
  const failures = s.bindAttempts + 1;
  const what = reason === 'NodeDidNotBind' ? 'did not bind in time' : 'refused the binding';
  const message = `the node ${what} (attempt ${failures} of ${s.timers.maxBindFailures})`;
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

function sameConditions(a: Condition[], b: Condition[]): boolean {
  const key = (c: Condition) => `${c.type}/${c.reason}/${c.message}`;
  return a.map(key).sort().join(',') === b.map(key).sort().join(',');
}

const nodeHealthTypes = new Set(['Degraded', 'NodeUnreachable']);

/**
 * The conditions an active reservation shows from its nodes and atoms (it is never released for
 * them): `Degraded` with `BindingLost` (a bound allocation lost or a forged report), else
 * `ForeignGpuExposure`, else `AtomUnhealthy`; and `NodeUnreachable` listing the nodes. Others kept.
 */
export function activeConditions(s: ReservationSnapshot): Condition[] {
  const keep = s.conditions.filter((c) => !nodeHealthTypes.has(c.type));
  const since = (type: string, reason: string) =>
    s.conditions.find((c) => c.type === type && c.reason === reason)?.since ?? s.now;
  const out = [...keep];
  const lost = s.allocations.length === 0 || s.allocations.some((a) => a.state !== 'bound' || a.bindingLost);
  const exposed = [...new Set(s.allocations.filter((a) => a.foreignGpuExposure).map((a) => a.nodeId))].sort();
  const unhealthy = [...new Set(s.allocations.flatMap((a) => a.unhealthyAtoms ?? []))].sort();
  if (lost) {
    out.push({ ...degradedLost, since: since('Degraded', 'BindingLost') });
  } else if (exposed.length > 0) {
    out.push({
      type: 'Degraded',
      reason: 'ForeignGpuExposure',
      message: `GPUs of ${exposed.join(', ')} can be handed to pods by something besides bcd`,
      since: since('Degraded', 'ForeignGpuExposure'),
    });
  } else if (unhealthy.length > 0) {
    out.push({
      type: 'Degraded',
      reason: 'AtomUnhealthy',
      message: `unhealthy: ${unhealthy.join(', ')}`,
      since: since('Degraded', 'AtomUnhealthy'),
    });
  }
  const unreachable = [
    ...new Set(s.allocations.filter((a) => a.nodeUnreachable).map((a) => a.nodeId)),
  ].sort();
  if (unreachable.length > 0) {
    out.push({
      type: 'NodeUnreachable',
      reason: 'Unreachable',
      message: `not connected: ${unreachable.join(', ')}`,
      since: since('NodeUnreachable', 'Unreachable'),
    });
  }
  return out;
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
      return { kind: 'end', state: 'released', reason: s.endReason ?? 'release' };
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
      if (!s.poolAvailable) {
        return {
          kind: 'end',
          state: 'failed',
          reason: 'pool-gone',
          condition: {
            type: 'Unschedulable',
            reason: 'PoolGone',
            message: 'the pool is archived or no longer offered',
          },
        };
      }
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
      const nextTry =
        memory.lastPlaceAttemptAt === null ? s.now : memory.lastPlaceAttemptAt + t.pendingRetryMs;
      if (intents.capacityFreed || s.now >= nextTry) return { kind: 'place' };
      return { kind: 'wait', until: earliest(recheck, nextTry, maxPendingAt), reason: 'pending-retry' };
    }
    case 'placed': {
      if (intents.cancel) return { kind: 'end', state: 'cancelled', reason: 'cancel' };
      const ending = endFor(s, intents);
      if (ending) return ending;
      const start = s.start ?? s.now;
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
      if (
        s.allocations.some((a) => a.state === 'failed' || a.state === 'released' || a.state === 'releasing')
      ) {
        return bindFailure(s, 'NodeRejectedBinding');
      }
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
  }
}

/** The operation state `reservations.get` shows for a reservation state (seed: waiting for placement). */
export function operationState(
  state: LifecycleState,
  conditions: Condition[],
): 'running' | 'pending' | 'succeeded' | 'failed' {
  switch (state) {
    case 'draft':
      return 'running';
    case 'pending':
      return conditions.some((c) => c.type === 'Queued') ? 'running' : 'pending';
    case 'awaiting-confirmation':
      return 'pending';
    case 'placed':
    case 'binding':
    case 'active':
    case 'releasing':
    case 'released':
      return 'succeeded';
    case 'failed':
    case 'denied':
    case 'cancelled':
    case 'expired':
      return 'failed';
  }
}
