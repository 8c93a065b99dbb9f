import { assertNever } from './errors.ts';
import { lostMembers, memberName } from './gang-lifecycle.ts';
import type { Condition, ReservationSnapshot } from './reservation-lifecycle-types.ts';
import type { ReservationState } from './reservation-states.ts';

/** A bound allocation lost its devices, or a later report of it failed verification. */
const degradedLost: Condition = {
  type: 'Degraded',
  reason: 'BindingLost',
  message: 'a node reported it lost devices it had bound',
};

export function sameConditions(a: Condition[], b: Condition[]): boolean {
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
    const members = (s.gangSize ?? 1) > 1 ? lostMembers(s) : [];
    out.push({
      ...degradedLost,
      ...(members.length > 0
        ? { message: `${degradedLost.message}: gang ${members.map(memberName).join(', ')}` }
        : {}),
      since: since('Degraded', 'BindingLost'),
    });
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

/** Whether a reservation waits for the pool-lease placer: `pending` with a `Queued` condition. */
export function isQueued(state: ReservationState, conditions: Condition[]): boolean {
  return state === 'pending' && conditions.some((c) => c.type === 'Queued');
}

/** The operation state `reservations.get` shows for a reservation state (seed: waiting for placement). */
export function operationState(
  state: ReservationState,
  conditions: Condition[],
): 'running' | 'pending' | 'succeeded' | 'failed' {
  switch (state) {
    case 'draft':
      return 'running';
    case 'pending':
      return isQueued(state, conditions) ? 'running' : 'pending';
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
    default:
      return assertNever(state);
  }
}
