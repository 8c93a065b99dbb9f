import {
  type Interval,
  type NodeFit,
  type PlacementRequest,
  type PlacerNode,
  tightestFits,
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
    // planPlacement over every candidate for every request of a batch was most of a batch's time.
    const fit = tightestFits(nodes, r.request, r.window, r.id)[0];
    if (!fit) {
      plan.unplaced.push(r.id);
      continue;
    }
    plan.planned.push({ id: r.id, fit, window: r.window });
    recordPlannedBooking(byId.get(fit.nodeId)!, fit, r.window);
  }
  return plan;
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
