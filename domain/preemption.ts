import { fitNode, type Interval, type NodeFit, type PlacementRequest, type PlacerNode } from './placer.ts';
import { poolPolicyDefaults, readPoolPolicy } from './pool-policy.ts';
import type { HostResourceAmounts } from './reservation-request.ts';

/**
 * Spot preemption's pure part: which live spot reservations to preempt so that a regular request
 * that does not fit would fit, and from when. No I/O: db/reservations/preemption.ts loads the
 * holdings and applies the choice in one transaction.
 */

/** What one spot reservation holds on one node over the window asked about. */
export interface SpotHolding {
  reservationId: string;
  nodeId: string;
  /** Whether it has started (binding or active): it gets the notice; one that has not is re-queued. */
  started: boolean;
  /** When it started (its window's start), epoch ms: the most recently started is preempted first. */
  startedAt: number;
  deviceIds: readonly string[];
  /** The booking's own interval (its device and scalar bookings carry exactly this one). */
  interval: Interval;
  resources: Partial<HostResourceAmounts>;
}

export interface PreemptionChoice {
  nodeId: string;
  fit: NodeFit;
  /** The chosen spot reservations, most recently started first. */
  reservationIds: string[];
  /** Of those, the ones that had started and get the notice (the others are re-queued). */
  noticed: string[];
  /** The regular request's window: from the deadline, or from `earlyWindow` when nothing chosen had started. */
  window: Interval;
}

/** The pool policy's notice: `spot.noticeSeconds`, else 120 s (pool-policy.ts declares the knob). */
export function spotNoticeMs(policy: unknown): number {
  return (readPoolPolicy(policy).spot?.noticeSeconds ?? poolPolicyDefaults.spotNoticeSeconds) * 1000;
}

/**
 * Whether a regular request that does not fit now should preempt at all: never for a spot
 * request, and not when waiting for capacity (the earliest start that fits without preempting)
 * would take no longer than the notice: it then just waits.
 */
export function shouldPreempt(input: {
  spot: boolean;
  earliestStart: number | null;
  deadline: number;
}): boolean {
  if (input.spot) return false;
  return input.earliestStart === null || input.earliestStart > input.deadline;
}

/** The node as it would be without the given holdings' bookings (and their host resources). */
function without(node: PlacerNode, holdings: readonly SpotHolding[]): PlacerNode {
  if (holdings.length === 0) return node;
  const freed = new Map<string, Interval[]>();
  for (const h of holdings) for (const d of h.deviceIds) freed.set(d, [...(freed.get(d) ?? []), h.interval]);
  const same = (a: Interval, b: Interval) => a.start === b.start && a.end === b.end;
  const host: PlacerNode['host'] = {};
  for (const [key, row] of Object.entries(node.host) as Array<
    [keyof HostResourceAmounts, NonNullable<PlacerNode['host'][keyof HostResourceAmounts]>]
  >) {
    const bookings = [...row.bookings];
    for (const h of holdings) {
      const amount = h.resources[key];
      if (!amount) continue;
      const at = bookings.findIndex((b) => same(b, h.interval) && b.amount === amount);
      if (at >= 0) bookings.splice(at, 1);
    }
    host[key] = { allocatable: row.allocatable, bookings };
  }
  return {
    ...node,
    host,
    devices: node.devices.map((d) => {
      const gone = freed.get(d.id);
      return gone ? { ...d, bookings: d.bookings.filter((b) => !gone.some((g) => same(g, b))) } : d;
    }),
  };
}

/** Larger is better: the chosen reservations' starts, latest first, compared element by element. */
function recency(set: readonly SpotHolding[][]): number[] {
  return set.map((hs) => hs[0]!.startedAt).sort((a, b) => b - a);
}

function laterFirst(a: number[], b: number[]): number {
  for (let i = 0; i < Math.min(a.length, b.length); i++) if (a[i] !== b[i]) return b[i]! - a[i]!;
  return a.length - b.length;
}

/** Every k-subset of 0..n-1 in lexicographic order, until `visit` answers true or `budget` runs out. */
function someCombination(
  n: number,
  k: number,
  budget: { left: number },
  visit: (idx: number[]) => boolean,
): boolean {
  const idx = Array.from({ length: k }, (_, i) => i);
  for (;;) {
    if (budget.left-- <= 0) return false;
    if (visit(idx)) return true;
    let i = k - 1;
    while (i >= 0 && idx[i] === n - k + i) i--;
    if (i < 0) return false;
    idx[i]! += 1;
    for (let j = i + 1; j < k; j++) idx[j] = idx[j - 1]! + 1;
  }
}

/**
 * The spot reservations to preempt so that `request` fits over `window` (which starts at the
 * notice deadline): on one node, the fewest reservations, then the most recently started, then the
 * tightest fit. A reservation's holdings on the chosen node are all removed (holdings elsewhere
 * are preempted with it but do not count). When none of the chosen had started and the request
 * fits over `earlyWindow` too, that earlier window is answered. Null when no set of at most
 * `maxSetSize` spot reservations on one node makes it fit. Bounded: at most `budget` trial fits.
 */
export function choosePreemption(input: {
  nodes: readonly PlacerNode[];
  holdings: readonly SpotHolding[];
  request: PlacementRequest;
  window: Interval;
  earlyWindow?: Interval;
  maxSetSize?: number;
  budget?: number;
}): PreemptionChoice | null {
  const maxSetSize = input.maxSetSize ?? 8;
  const budget = { left: input.budget ?? 50_000 };
  const byNode = new Map<string, Map<string, SpotHolding[]>>();
  for (const h of input.holdings) {
    const node = byNode.get(h.nodeId) ?? new Map<string, SpotHolding[]>();
    byNode.set(h.nodeId, node);
    node.set(h.reservationId, [...(node.get(h.reservationId) ?? []), h]);
  }
  let best: { node: PlacerNode; set: SpotHolding[][]; fit: NodeFit } | null = null;
  for (const node of input.nodes) {
    const here = byNode.get(node.id);
    if (!here) continue;
    // Most recently started first, so the first fitting set of a size is the most recent one.
    const candidates = [...here.values()].sort(
      (a, b) => b[0]!.startedAt - a[0]!.startedAt || a[0]!.reservationId.localeCompare(b[0]!.reservationId),
    );
    // Cheap bound first: without every spot reservation of the node, does it fit at all?
    if (!('fit' in fitNode(without(node, candidates.flat()), input.request, input.window))) continue;
    const limit = Math.min(candidates.length, maxSetSize, best ? best.set.length : maxSetSize);
    for (let k = 1; k <= limit; k++) {
      let found: { set: SpotHolding[][]; fit: NodeFit } | null = null;
      someCombination(candidates.length, k, budget, (idx) => {
        const set = idx.map((i) => candidates[i]!);
        const result = fitNode(without(node, set.flat()), input.request, input.window);
        if ('fit' in result) found = { set, fit: result.fit };
        return found !== null;
      });
      if (!found) continue;
      const f = found as { set: SpotHolding[][]; fit: NodeFit };
      const better =
        !best ||
        f.set.length < best.set.length ||
        (f.set.length === best.set.length &&
          (laterFirst(recency(f.set), recency(best.set)) < 0 ||
            (laterFirst(recency(f.set), recency(best.set)) === 0 && f.fit.leftover < best.fit.leftover)));
      if (better) best = { node, ...f };
      break;
    }
    if (budget.left <= 0) break;
  }
  if (!best) return null;
  const chosen = best.set;
  const reservationIds = chosen.map((hs) => hs[0]!.reservationId);
  const noticed = chosen.filter((hs) => hs[0]!.started).map((hs) => hs[0]!.reservationId);
  if (noticed.length === 0 && input.earlyWindow) {
    const early = fitNode(without(best.node, chosen.flat()), input.request, input.earlyWindow);
    if ('fit' in early) {
      return { nodeId: best.node.id, fit: early.fit, reservationIds, noticed, window: input.earlyWindow };
    }
  }
  return { nodeId: best.node.id, fit: best.fit, reservationIds, noticed, window: input.window };
}

/** What a placement that preempted did, for the caller to start the preemption workflow after commit. */
export interface PreemptionSummary {
  /** The preemption workflow's id: one per preempting placement. */
  id: string;
  reservationId: string;
  tenantId: string;
  poolId: string;
  /** When the noticed spot reservations are released and the regular one starts (epoch ms). */
  deadline: number;
  noticeSeconds: number;
  /** Spot reservations that had started: they run until the deadline. */
  noticed: string[];
  /** Spot reservations that had not started: they went back to pending. */
  requeued: string[];
}
