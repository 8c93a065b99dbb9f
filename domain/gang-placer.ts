import {
  candidateStarts,
  type Interval,
  type NodeFit,
  type PlacementPlan,
  type PlacementRequest,
  type PlacerNode,
  planPlacement,
  rejectionReasons,
} from './placer.ts';

/**
 * The gang placer's pure part: `size` distinct nodes that each fit the per-node request over one
 * window, all on one value of a topology label when the gang names one. No I/O:
 * db/allocations/gang-placement.ts loads the nodes and books the members.
 */

export interface GangShape {
  size: number;
  /** A node label (e.g. `fabric.domain`) whose one value every member shares. */
  topologyKey?: string | undefined;
}

/** One group of candidate nodes: the nodes of one topology value, or the whole pool without a key. */
export interface GangGroup {
  /** The label's value; null without a topologyKey. */
  value: string | null;
  /** The group's plan: its fitting nodes best first, the others counted by why not. */
  plan: PlacementPlan;
  /** Whether at least `size` of its nodes fit. */
  fits: boolean;
}

export interface GangPlan {
  /** The groups the gang fits in, best first. */
  candidates: GangGroup[];
  /** Every group, by value. */
  groups: GangGroup[];
  /** Nodes without the topology label (never members). */
  unlabelled: number;
  nodes: number;
}

/** The value of `key` a node carries, as the placer counts labels. */
export function topologyValueOf(node: PlacerNode, key: string): string | undefined {
  return node.labels[key];
}

const leftoverOf = (fits: readonly NodeFit[], size: number) =>
  fits.slice(0, size).reduce((n, f) => n + f.leftover, 0);

/**
 * Plans a gang over `window`: the nodes grouped by their value of `gang.topologyKey` (one group of
 * the whole pool without a key), each group planned as a single-node request, and the groups
 * holding at least `size` fitting nodes ranked best first. Best: the fewest fitting nodes left
 * over beyond the gang (a tight group keeps the larger ones whole for larger gangs), then the
 * tightest members (fewest free atoms left on them), then the value's name (deterministic).
 * Within a group the members are the group plan's best fits, ties spread by `seed`.
 */
export function planGang(
  nodes: readonly PlacerNode[],
  request: PlacementRequest,
  gang: GangShape,
  window: Interval,
  seed = '',
): GangPlan {
  const byValue = new Map<string | null, PlacerNode[]>();
  let unlabelled = 0;
  for (const node of nodes) {
    const value = gang.topologyKey === undefined ? null : topologyValueOf(node, gang.topologyKey);
    if (value === undefined) {
      unlabelled++;
      continue;
    }
    byValue.set(value, [...(byValue.get(value) ?? []), node]);
  }
  if (gang.topologyKey === undefined && !byValue.has(null)) byValue.set(null, []);
  const groups = [...byValue.entries()]
    .sort(([a], [b]) => String(a).localeCompare(String(b)))
    .map(([value, members]): GangGroup => {
      const plan = planPlacement(members, request, window, seed);
      return { value, plan, fits: plan.fits.length >= gang.size };
    });
  const candidates = groups
    .filter((g) => g.fits)
    .sort(
      (a, b) =>
        a.plan.fits.length - b.plan.fits.length ||
        leftoverOf(a.plan.fits, gang.size) - leftoverOf(b.plan.fits, gang.size) ||
        String(a.value).localeCompare(String(b.value)),
    );
  return { candidates, groups, unlabelled, nodes: nodes.length };
}

/** How one group fares, for people: `3 of 4 nodes fit (1 lacks 8 free GPUs)`. */
function groupPhrase(group: GangGroup, request: PlacementRequest): string {
  const { plan } = group;
  const reasons = rejectionReasons(plan, request);
  return `${plan.fits.length} of ${plan.nodes} node${plan.nodes === 1 ? '' : 's'} fit${reasons ? ` (${reasons})` : ''}`;
}

/** Per group: its value, its nodes, how many fit, and why it was rejected (null when the gang fits). */
export interface GangGroupSummary {
  value: string | null;
  nodes: number;
  fitting: number;
  rejected: string | null;
}

/** Every group of a gang plan and why each was rejected, for capacity.preview. */
export function summarizeGangGroups(
  plan: GangPlan,
  request: PlacementRequest,
  gang: GangShape,
): GangGroupSummary[] {
  return plan.groups.map((g) => ({
    value: g.value,
    nodes: g.plan.nodes,
    fitting: g.plan.fits.length,
    rejected: g.fits ? null : `${groupPhrase(g, request)}; a gang of ${gang.size} needs ${gang.size}`,
  }));
}

/**
 * Why a gang does not fit, naming each topology value and why it was rejected:
 * `no fabric.domain value has 4 nodes that fit: fabric.domain=a: 3 of 4 nodes fit (1 lacks 8 free
 * GPUs); fabric.domain=b: 2 of 2 nodes fit; 1 node lacks label fabric.domain`.
 */
export function summarizeGangNoFit(plan: GangPlan, request: PlacementRequest, gang: GangShape): string {
  if (plan.nodes === 0) return `a gang of ${gang.size} needs ${gang.size} nodes: the pool has no nodes`;
  const key = gang.topologyKey;
  if (key === undefined) {
    return `a gang of ${gang.size} needs ${gang.size} nodes that fit: ${groupPhrase(plan.groups[0]!, request)}`;
  }
  const lacking =
    plan.unlabelled > 0
      ? `${plan.unlabelled} node${plan.unlabelled === 1 ? ' lacks' : 's lack'} label ${key}`
      : null;
  if (plan.groups.length === 0) return `no node carries label ${key} (${lacking})`;
  const parts = plan.groups.map((g) => `${key}=${g.value}: ${groupPhrase(g, request)}`);
  return `no ${key} value has ${gang.size} nodes that fit: ${[...parts, ...(lacking ? [lacking] : [])].join('; ')}`;
}

/**
 * The earliest start within [from, from + horizonMs] at which the whole gang fits for
 * `durationMs` (the counter-offer), trying only the instants a fit can begin at. Null when it
 * does not fit within the horizon.
 */
export function earliestGangStart(
  nodes: readonly PlacerNode[],
  request: PlacementRequest,
  gang: GangShape,
  durationMs: number,
  from: number,
  horizonMs: number,
): number | null {
  for (const start of candidateStarts(nodes, from, horizonMs)) {
    const plan = planGang(nodes, request, gang, { start, end: start + durationMs });
    if (plan.candidates.length > 0) return start;
  }
  return null;
}
