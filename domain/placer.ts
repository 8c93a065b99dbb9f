import { assertNever } from './errors.ts';
import { exhaustionOf } from './holds.ts';
import type { DeviceClass, HostResourceAmounts, Topology } from './reservation-request.ts';

/**
 * The inline placer's pure part: which nodes fit a request over a window, how good each fit is,
 * and why the others do not. No I/O: db/placement.ts loads the nodes and commits the booking.
 */

export interface Interval {
  start: number;
  end: number;
}

export interface PlacerDevice {
  id: string;
  class: string;
  attributes: Record<string, unknown>;
  healthy: boolean;
  /** Bookings of this device (epoch ms, end exclusive) that may overlap windows asked about. */
  bookings: Interval[];
}

export interface PlacerNode {
  id: string;
  name: string;
  ready: boolean;
  cordoned: boolean;
  maintenance: boolean;
  draining: boolean;
  connected: boolean;
  converged: boolean;
  /** The type of a NoSchedule condition, if the node has one. */
  noSchedule: string | null;
  /** Labels that count: every non-`bc.dev/` label, and `bc.dev/` ones only from the system. */
  labels: Record<string, string>;
  devices: PlacerDevice[];
  /** Host resource rows (absent: the host books none). */
  host: Partial<
    Record<keyof HostResourceAmounts, { allocatable: number; bookings: Array<Interval & { amount: number }> }>
  >;
}

export interface PlacementRequest {
  deviceClass: DeviceClass;
  count: number;
  topology: Topology;
  selector?: { attributes?: Record<string, string | number | boolean>; nodeLabels?: Record<string, string> };
  /** Per node; zero books nothing. */
  resources: HostResourceAmounts;
  /** Labels a node must carry (any value), e.g. `bc.dev/cap.binding.kubernetes`. */
  requiredLabels: string[];
}

export type Rejection =
  | 'not-ready'
  | 'cordoned'
  | 'maintenance'
  | 'draining'
  | 'unreachable'
  | 'not-converged'
  | 'no-schedule'
  | 'labels'
  | 'selector'
  | 'devices'
  | 'nvlink'
  | 'host-resources'
  | 'reservations-exhausted';

export interface NodeFit {
  nodeId: string;
  nodeName: string;
  deviceIds: string[];
  /** Free atoms of the class left on the node after this fit: lower is a better (tighter) fit. */
  leftover: number;
  /** Booked host resources (only those the node has rows for). */
  resources: Partial<HostResourceAmounts>;
}

export interface PlacementPlan {
  fits: NodeFit[];
  rejections: Partial<Record<Rejection, number>>;
  nodes: number;
  /** The label a `labels` rejection lacked (for the summary). */
  missingLabel?: string;
  /** The NoSchedule condition a `no-schedule` rejection named (for the summary: an operator's taint). */
  noScheduleCondition?: string;
}

export const capDevicesLimitsLabel = 'bc.dev/cap.devices.limits';

const overlaps = (a: Interval, b: Interval) => a.start < b.end && b.start < a.end;

function schedulingRejection(node: PlacerNode): Rejection | null {
  if (node.cordoned) return 'cordoned';
  if (node.maintenance) return 'maintenance';
  if (node.draining) return 'draining';
  if (!node.ready) return 'not-ready';
  if (!node.connected) return 'unreachable';
  if (!node.converged) return 'not-converged';
  if (node.noSchedule) return 'no-schedule';
  return null;
}

/** Free amount of a host resource over `window` (null: the host books none of it). */
function hostFree(node: PlacerNode, resource: keyof HostResourceAmounts, window: Interval): number | null {
  const row = node.host[resource];
  if (!row) return null;
  let booked = 0;
  for (const b of row.bookings) if (overlaps(b, window)) booked += b.amount;
  return row.allocatable - booked;
}

/**
 * A small stable hash (FNV-1a over the first UTF-16 unit of each code point of `seed + id`), so
 * equally good fits are spread across callers instead of all taking the first. `spreader(seed)`
 * hashes the seed once for every id of one plan.
 */
function spreader(seed: string): (id: string) => number {
  const fold = (h: number, text: string) => {
    for (let i = 0; i < text.length; i++) {
      const unit = text.charCodeAt(i);
      h = Math.imul(h ^ unit, 16777619);
      // A surrogate pair is one code point: its second unit does not count.
      if (unit >= 0xd800 && unit <= 0xdbff) {
        const next = text.charCodeAt(i + 1);
        if (next >= 0xdc00 && next <= 0xdfff) i++;
      }
    }
    return h;
  };
  const seeded = fold(2166136261, seed);
  return (id) => fold(seeded, id) >>> 0;
}

/** Each fit's spread by `seed`, computed once per fit (a sort compares each fit many times). */
export function spreadBy(fits: readonly NodeFit[], seed: string): (fit: NodeFit) => number {
  const spread = spreader(seed);
  const byNode = new Map(fits.map((f) => [f.nodeId, spread(f.nodeId)]));
  return (fit) => byNode.get(fit.nodeId)!;
}

type FitResult = { fit: NodeFit } | { rejection: Rejection; label?: string; condition?: string };

/**
 * The labels a node must carry to take the request: the required ones and, when it books host
 * resources, the device-limits capability (any value: null), and the selector's (that value).
 */
export function labelsNeeded(node: PlacerNode, request: PlacementRequest): Record<string, string | null> {
  const needed: Record<string, string | null> = {};
  for (const label of [
    ...request.requiredLabels,
    ...(booksHost(node, request) ? [capDevicesLimitsLabel] : []),
  ]) {
    needed[label] = null;
  }
  for (const [key, value] of Object.entries(request.selector?.nodeLabels ?? {})) needed[key] = value;
  return needed;
}

/** Whether the request books host resources on this node (it has host rows and asks for some). */
function booksHost(node: PlacerNode, request: PlacementRequest): boolean {
  const { vcpu, memoryGiB, hugepages1Gi } = request.resources;
  if (vcpu <= 0 && memoryGiB <= 0 && hugepages1Gi <= 0) return false;
  for (const _ in node.host) return true;
  return false;
}

const hostResourceKeys = ['vcpu', 'memoryGiB', 'hugepages1Gi'] as const;

/**
 * Why the node's labels refuse the request, checked in labelsNeeded's order without building it:
 * a label needed with any value that the node lacks ('labels', named), then a selector label with
 * another value ('selector'). Null when they admit it.
 */
function labelRejection(node: PlacerNode, request: PlacementRequest): FitResult | null {
  const pinned = request.selector?.nodeLabels;
  const anyValue = (label: string) =>
    !(pinned && Object.hasOwn(pinned, label)) && node.labels[label] === undefined;
  for (const label of request.requiredLabels) if (anyValue(label)) return { rejection: 'labels', label };
  if (booksHost(node, request) && anyValue(capDevicesLimitsLabel))
    return { rejection: 'labels', label: capDevicesLimitsLabel };
  if (pinned)
    for (const key in pinned) if (node.labels[key] !== pinned[key]) return { rejection: 'selector' };
  return null;
}

const byIndex = (a: PlacerDevice, b: PlacerDevice) =>
  Number(a.attributes.index ?? 0) - Number(b.attributes.index ?? 0) || (a.id < b.id ? -1 : 1);

/**
 * Whether one node fits the request over `window`, and with which atoms. Called for every
 * candidate of every plan (128 warm nodes a placement), so it walks the devices once and builds
 * nothing for a node it refuses.
 */
export function fitNode(node: PlacerNode, request: PlacementRequest, window: Interval): FitResult {
  const scheduling = schedulingRejection(node);
  if (scheduling)
    return {
      rejection: scheduling,
      ...(scheduling === 'no-schedule' ? { condition: node.noSchedule! } : {}),
    };
  const labels = labelRejection(node, request);
  if (labels) return labels;
  const selected = request.selector?.attributes;
  const wanted = selected ? Object.entries(selected) : [];
  let ofClass = 0;
  let matching = 0;
  const free: PlacerDevice[] = [];
  for (const d of node.devices) {
    if (d.class !== request.deviceClass || !d.healthy) continue;
    ofClass++;
    if (!wanted.every(([key, value]) => d.attributes[key] === value)) continue;
    matching++;
    if (!d.bookings.some((b) => overlaps(b, window))) free.push(d);
  }
  if (matching < request.count) return { rejection: ofClass >= request.count ? 'selector' : 'devices' };
  if (free.length < request.count)
    return { rejection: request.topology === 'nvlink-all' ? 'nvlink' : 'devices' };

  // Group free atoms by NVLink domain; take from the tightest domain that holds them all.
  const domains = new Map<string, PlacerDevice[]>();
  for (const d of free) {
    const key = String(d.attributes.nvlinkDomain ?? '');
    const domain = domains.get(key);
    if (domain) domain.push(d);
    else domains.set(key, [d]);
  }
  let tight: PlacerDevice[] | undefined;
  for (const ds of domains.values())
    if (ds.length >= request.count && (!tight || ds.length < tight.length)) tight = ds;
  let chosen: PlacerDevice[];
  if (tight) chosen = [...tight].sort(byIndex).slice(0, request.count);
  else if (request.topology === 'nvlink-all') return { rejection: 'nvlink' };
  else chosen = [...free].sort(byIndex).slice(0, request.count);

  const resources: Partial<HostResourceAmounts> = {};
  const freeCpu = hostFree(node, 'vcpu', window);
  const freeMemory = hostFree(node, 'memoryGiB', window);
  for (const key of hostResourceKeys) {
    const amount = request.resources[key];
    if (amount <= 0) continue;
    const available =
      key === 'vcpu' ? freeCpu : key === 'memoryGiB' ? freeMemory : hostFree(node, key, window);
    if (available === null) continue;
    if (available < amount) return { rejection: 'host-resources' };
    resources[key] = amount;
  }
  // A host left with less than one core or one GiB publishes that it takes no work (holds.ts).
  if (exhaustionOf({ cpuCores: freeCpu, ramGiB: freeMemory })) return { rejection: 'reservations-exhausted' };
  return {
    fit: {
      nodeId: node.id,
      nodeName: node.name,
      deviceIds: chosen.map((d) => d.id),
      leftover: free.length - request.count,
      resources,
    },
  };
}

/**
 * Every node that fits, best first: the tightest fit (fewest free atoms left, so whole nodes stay
 * free), ties spread by `seed`; and every other node counted by why it does not fit.
 */
export function planPlacement(
  nodes: readonly PlacerNode[],
  request: PlacementRequest,
  window: Interval,
  seed = '',
): PlacementPlan {
  const fits: NodeFit[] = [];
  const rejections: Partial<Record<Rejection, number>> = {};
  let missingLabel: string | undefined;
  let noScheduleCondition: string | undefined;
  for (const node of nodes) {
    const result = fitNode(node, request, window);
    if ('fit' in result) fits.push(result.fit);
    else {
      rejections[result.rejection] = (rejections[result.rejection] ?? 0) + 1;
      if (result.label) missingLabel ??= result.label;
      if (result.condition) noScheduleCondition ??= result.condition;
    }
  }
  const spread = spreadBy(fits, seed);
  fits.sort((a, b) => a.leftover - b.leftover || spread(a) - spread(b));
  return {
    fits,
    rejections,
    nodes: nodes.length,
    ...(missingLabel ? { missingLabel } : {}),
    ...(noScheduleCondition ? { noScheduleCondition } : {}),
  };
}

/** A node's healthy atoms of the request's class free over `window` (a cheap upper bound of a fit). */
export function freeAtoms(node: PlacerNode, request: PlacementRequest, window: Interval): number {
  let free = 0;
  for (const d of node.devices) {
    if (d.class !== request.deviceClass || !d.healthy) continue;
    if (!d.bookings.some((b) => overlaps(b, window))) free++;
  }
  return free;
}

/** How many of the tightest-looking candidates tightestFits plans first. */
const closestNodes = 16;

/**
 * The fits a placer that books one of the first needs, best first as planPlacement orders them,
 * for a fraction of its work: only the 16 nodes with the fewest free atoms that still have enough
 * (where best fit lands; ties spread by `seed`, as planPlacement spreads them) are planned, and the
 * other roomy nodes only when none of those fits. Answers no rejections: a NoFit is explained by
 * planPlacement over the whole candidate list.
 */
export function tightestFits(
  nodes: readonly PlacerNode[],
  request: PlacementRequest,
  window: Interval,
  seed = '',
): NodeFit[] {
  const roomy: Array<{ node: PlacerNode; free: number; spread: number }> = [];
  for (const node of nodes) {
    const free = freeAtoms(node, request, window);
    if (free >= request.count) roomy.push({ node, free, spread: 0 });
  }
  if (roomy.length > closestNodes) {
    const spread = spreader(seed);
    for (const r of roomy) r.spread = spread(r.node.id);
    roomy.sort((a, b) => a.free - b.free || a.spread - b.spread);
  }
  const plan = (some: typeof roomy) =>
    planPlacement(
      some.map((r) => r.node),
      request,
      window,
      seed,
    ).fits;
  const first = plan(roomy.slice(0, closestNodes));
  return first.length > 0 || roomy.length <= closestNodes ? first : plan(roomy.slice(closestNodes));
}

const classNoun: Record<DeviceClass, [string, string]> = {
  gpu: ['GPU', 'GPUs'],
  'gpu.mig': ['MIG instance', 'MIG instances'],
  'gpu.slot': ['GPU slot', 'GPU slots'],
};

function phrase(
  rejection: Rejection,
  n: number,
  request: PlacementRequest,
  label?: string,
  condition?: string,
): string {
  const one = n === 1;
  const noun = classNoun[request.deviceClass][request.count === 1 ? 0 : 1];
  const lack = one ? 'lacks' : 'lack';
  const be = one ? 'is' : 'are';
  const have = one ? 'has' : 'have';
  switch (rejection) {
    case 'not-ready':
      return `${n} ${be} not ready`;
    case 'cordoned':
      return `${n} ${be} cordoned`;
    case 'maintenance':
      return `${n} ${be} in maintenance`;
    case 'draining':
      return `${n} ${be} draining`;
    case 'unreachable':
      return `${n} ${be} not connected`;
    case 'not-converged':
      return `${n} ${have} not converged`;
    case 'no-schedule':
      return `${n} ${have} a NoSchedule condition${condition ? ` (${condition})` : ''}`;
    case 'labels':
      return `${n} ${lack} label ${label ?? 'required'}=*`;
    case 'selector':
      return `${n} ${one ? 'does' : 'do'} not match the selector`;
    case 'devices':
      return `${n} ${lack} ${request.count} free ${noun}`;
    case 'nvlink':
      return `${n} ${lack} ${request.count} free ${noun} in one NVLink domain`;
    case 'reservations-exhausted':
      return `${n} ${have} less than 1 core or 1 GiB left (reservations_exhausted)`;
    case 'host-resources': {
      const r = request.resources;
      return `${n} ${lack} the host resources (${r.vcpu} vCPU, ${r.memoryGiB} GiB memory${r.hugepages1Gi ? `, ${r.hugepages1Gi} 1Gi huge pages` : ''})`;
    }
    default:
      return assertNever(rejection);
  }
}

/** `0 of 12 nodes fit: 9 lack 4 free GPUs in one NVLink domain, 3 are cordoned` (largest reason first). */
export function summarizeNoFit(plan: PlacementPlan, request: PlacementRequest): string {
  if (plan.nodes === 0) return '0 of 0 nodes fit: the pool has no nodes';
  return `${plan.fits.length} of ${plan.nodes} node${plan.nodes === 1 ? '' : 's'} fit: ${rejectionReasons(plan, request)}`;
}

/** Why the nodes a plan rejected do not fit, largest reason first: `9 lack 4 free GPUs, 3 are cordoned`. */
export function rejectionReasons(plan: PlacementPlan, request: PlacementRequest): string {
  return (Object.entries(plan.rejections) as Array<[Rejection, number]>)
    .sort((a, b) => b[1] - a[1])
    .map(([rejection, n]) => phrase(rejection, n, request, plan.missingLabel, plan.noScheduleCondition))
    .join(', ');
}

/**
 * The only instants a fit can begin at within [from, from + horizonMs]: `from` and the ends of the
 * nodes' bookings, in order, at most `maxCandidates` of them.
 */
export function candidateStarts(
  nodes: readonly PlacerNode[],
  from: number,
  horizonMs: number,
  maxCandidates = 400,
): number[] {
  const ends = new Set<number>([from]);
  for (const node of nodes) {
    for (const d of node.devices)
      for (const b of d.bookings) if (b.end > from && b.end <= from + horizonMs) ends.add(b.end);
    for (const row of Object.values(node.host)) {
      for (const b of row?.bookings ?? []) if (b.end > from && b.end <= from + horizonMs) ends.add(b.end);
    }
  }
  return [...ends].sort((a, b) => a - b).slice(0, maxCandidates);
}

/**
 * The earliest start within [from, from + horizonMs] at which the request fits for `durationMs`,
 * from the bookings the nodes carry. A fit on a node can begin at `from` or when one of that
 * node's own bookings ends: just before such an instant the node carries no booking it does not
 * carry at it, so a fit could begin earlier. Each node tries only its own instants, in order, up
 * to the earliest found so far: a pool of 10,000 nodes costs a few tries a node, not every
 * node at every instant of the pool. Null when nothing fits within the horizon.
 */
export function earliestStart(
  nodes: readonly PlacerNode[],
  request: PlacementRequest,
  durationMs: number,
  from: number,
  horizonMs: number,
  maxCandidates = 400,
): number | null {
  let earliest: number | null = null;
  for (const node of nodes) {
    for (const start of candidateStarts([node], from, horizonMs, maxCandidates)) {
      if (earliest !== null && start >= earliest) break;
      if ('fit' in fitNode(node, request, { start, end: start + durationMs })) {
        earliest = start;
        break;
      }
    }
    if (earliest === from) break;
  }
  return earliest;
}
