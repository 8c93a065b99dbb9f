import {
  fitNode,
  type Interval,
  type NodeFit,
  type PlacementPlan,
  type PlacementRequest,
  type PlacerNode,
  rejectionReasons,
  spreadBy,
} from './placer.ts';
import type { LifecycleTimers } from './reservation-lifecycle-types.ts';

/**
 * Dedicated root (`binding: 'node'`): a lease of whole bare machines of a `tenantRoot` pool. Each
 * machine is booked whole (every bookable atom and every host resource row), the lease's profile
 * is deployed on it at the start, and on release it is wiped by the ramdisk before its bookings
 * are freed. This is the pure part: which machines fit, and the lifecycle's limits for such a lease.
 */

/** How long a machine has, from the start, to be deployed and joined (2 hours). */
export const machineBindTimeoutMs = 2 * 3_600_000;

/**
 * The wipe after a lease: a leased machine's bookings run this long past the lease's own end
 * (unbilled: billing follows the allocation's window), so no later booking can start on the
 * machine while the ramdisk still wipes it after a natural end. A clean that finishes sooner frees
 * the machine then; one that fails puts it in maintenance.
 */
export const machineTurnaroundMs = 30 * 60_000;

/** The span a lease's machines are booked for: its window and the wipe after it. */
export function machineBookingWindow(window: Interval): Interval {
  return { start: window.start, end: window.end + machineTurnaroundMs };
}

/**
 * The lifecycle's timers for a dedicated-root lease: 2 hours to bind (the deploy), and one binding
 * attempt only, so a failed deploy fails the reservation rather than placing it a second time.
 */
export function machineLeaseTimers(timers: LifecycleTimers): LifecycleTimers {
  return {
    ...timers,
    bindTimeoutMs: Math.max(timers.bindTimeoutMs, machineBindTimeoutMs),
    maxBindFailures: 1,
  };
}

/** The idempotency key of the deploy (or clean) a lease runs for one of its allocations. */
export function machineWorkflowKey(kind: 'deploy' | 'clean', allocationId: string): string {
  return `lease-${kind}:${allocationId}`;
}

/** A request for every atom of `node` (the placer's checks for a whole machine). */
function wholeMachineRequest(node: PlacerNode): PlacementRequest {
  return {
    deviceClass: 'gpu',
    count: Math.max(1, node.devices.length),
    topology: 'any',
    resources: { vcpu: 0, memoryGiB: 0, hugepages1Gi: 0 },
    requiredLabels: [],
  };
}

const overlaps = (a: Interval, b: Interval) => a.start < b.end && b.start < a.end;

/**
 * Whether a whole machine is free over `window`: the placer's own checks (cordon, maintenance,
 * drain, provision state `ready`, NoSchedule, every atom healthy and unbooked), except that a
 * `ready` machine is powered off by design (no agent connected, no NodeSpec converged, its
 * NodeUnreachable condition expected), and none
 * of its host resources booked. The fit books every atom and every host resource row whole.
 */
export function fitMachine(node: PlacerNode, window: Interval): ReturnType<typeof fitNode> {
  // Its session's liveness lease ran out when it was powered off (NodeUnreachable): that is expected.
  const poweredOff = {
    ...node,
    connected: true,
    converged: true,
    noSchedule: node.noSchedule === 'NodeUnreachable' ? null : node.noSchedule,
  };
  const result = fitNode(poweredOff, wholeMachineRequest(node), window);
  if (!('fit' in result)) return result;
  const resources: NodeFit['resources'] = {};
  for (const [key, row] of Object.entries(node.host) as Array<
    [keyof NodeFit['resources'], NonNullable<PlacerNode['host']['vcpu']>]
  >) {
    if (row.bookings.some((b) => overlaps(b, window))) return { rejection: 'host-resources' };
    if (row.allocatable > 0) resources[key] = row.allocatable;
  }
  return { fit: { ...result.fit, leftover: 0, resources } };
}

/** Every machine free over `window`, in a stable order spread by `seed`, and why the others are not. */
export function planMachines(nodes: readonly PlacerNode[], window: Interval, seed = ''): PlacementPlan {
  const fits: NodeFit[] = [];
  const rejections: PlacementPlan['rejections'] = {};
  let noScheduleCondition: string | undefined;
  for (const node of nodes) {
    const result = fitMachine(node, window);
    if ('fit' in result) fits.push(result.fit);
    else {
      rejections[result.rejection] = (rejections[result.rejection] ?? 0) + 1;
      if ('condition' in result && result.condition) noScheduleCondition ??= result.condition;
    }
  }
  // Equally good machines are spread across leases, deterministically.
  const spread = spreadBy(fits, seed);
  fits.sort((a, b) => spread(a) - spread(b));
  return { fits, rejections, nodes: nodes.length, ...(noScheduleCondition ? { noScheduleCondition } : {}) };
}

/**
 * Why `count` whole machines are not free: `1 of 4 machines is free for the lease, 2 are needed:
 * 2 have a GPU booked or unhealthy in the window, 1 is not ready`.
 */
export function summarizeMachinesNoFit(plan: PlacementPlan, count: number): string {
  if (plan.nodes === 0) return 'the pool has no machines';
  const { devices = 0, nvlink = 0, selector = 0, ...others } = plan.rejections;
  const busy = devices + nvlink + selector;
  const reasons = [
    ...(busy > 0 ? [`${busy} ${busy === 1 ? 'has' : 'have'} a GPU booked or unhealthy in the window`] : []),
    ...(Object.keys(others).length > 0
      ? [
          rejectionReasons(
            { ...plan, rejections: others },
            {
              deviceClass: 'gpu',
              count: 1,
              topology: 'any',
              resources: { vcpu: 0, memoryGiB: 0, hugepages1Gi: 0 },
              requiredLabels: [],
            },
          ),
        ]
      : []),
  ];
  const free = plan.fits.length;
  return `${free} of ${plan.nodes} machine${plan.nodes === 1 ? '' : 's'} ${free === 1 ? 'is' : 'are'} free for the whole lease, ${count} ${count === 1 ? 'is' : 'are'} needed${reasons.length > 0 ? `: ${reasons.join(', ')}` : ''}`;
}
