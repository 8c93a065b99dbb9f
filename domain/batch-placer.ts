import {
  type Interval,
  type NodeFit,
  type PlacementRequest,
  type PlacerNode,
  planPlacement,
} from './placer.ts';

/** One queued request of a pool-lease batch, as the batch planner sees it. */
export interface BatchRequest {
  id: string;
  request: PlacementRequest;
  window: Interval;
}

export interface BatchPlan {
  /** Requests that fit, in the order given, each with its best fit. */
  planned: Array<{ id: string; fit: NodeFit; window: Interval }>;
  /** Requests no node of `nodes` fits once the earlier ones are planned, in the order given. */
  unplaced: string[];
}

/**
 * Plans a batch of requests in memory, in the order given (the queue's fair order: whoever comes
 * first takes the best fit): each request gets the inline placer's best fit (planPlacement: the
 * tightest node, ties spread by the request's id) among `nodes`, and its atoms and host resources
 * are added to that node's bookings over its window, so the next request plans around it. Mutates
 * the nodes' bookings (the caller's working copy). Pure otherwise: it books nothing; the caller
 * books the plan under locks and the constraint.
 */
export function planBatch(nodes: readonly PlacerNode[], requests: readonly BatchRequest[]): BatchPlan {
  const plan: BatchPlan = { planned: [], unplaced: [] };
  const byId = new Map(nodes.map((n) => [n.id, n]));
  for (const r of requests) {
    // The fullest nodes that still have enough free atoms first (where best fit lands), the whole
    // list only when none of them fits: planPlacement over every candidate for every request of a
    // batch was most of a batch's time.
    const roomy = nodes
      .map((node) => ({ node, free: freeAtoms(node, r.request, r.window) }))
      .filter((n) => n.free >= r.request.count)
      .sort((a, b) => a.free - b.free);
    const fit =
      planPlacement(
        roomy.slice(0, closestNodes).map((n) => n.node),
        r.request,
        r.window,
        r.id,
      ).fits[0] ??
      (roomy.length > closestNodes
        ? planPlacement(
            roomy.slice(closestNodes).map((n) => n.node),
            r.request,
            r.window,
            r.id,
          ).fits[0]
        : undefined);
    if (!fit) {
      plan.unplaced.push(r.id);
      continue;
    }
    plan.planned.push({ id: r.id, fit, window: r.window });
    recordPlannedBooking(byId.get(fit.nodeId)!, fit, r.window);
  }
  return plan;
}

/** How many of the tightest-looking candidates are planned first. */
const closestNodes = 16;

/** A node's healthy atoms of the request's class free over `window` (a cheap upper bound of a fit). */
export function freeAtoms(node: PlacerNode, request: PlacementRequest, window: Interval): number {
  let free = 0;
  for (const d of node.devices) {
    if (d.class !== request.deviceClass || !d.healthy) continue;
    if (!d.bookings.some((b) => b.start < window.end && window.start < b.end)) free++;
  }
  return free;
}

/** What a planned fit takes, added to its node's bookings in memory. */
export function recordPlannedBooking(node: PlacerNode, fit: NodeFit, window: Interval): void {
  const taken = new Set(fit.deviceIds);
  for (const device of node.devices) if (taken.has(device.id)) device.bookings.push({ ...window });
  for (const [resource, amount] of Object.entries(fit.resources)) {
    const row = node.host[resource as keyof typeof node.host];
    if (row && amount) row.bookings.push({ ...window, amount });
  }
}
