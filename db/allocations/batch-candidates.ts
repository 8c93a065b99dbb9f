import type { Transaction } from 'kysely';
import type { AdmissionCaches } from '../../core/admission-caches.ts';
import type { Database } from '../../core/database.ts';
import type { Interval, PlacementRequest, PlacerNode } from '../../domain/placer.ts';
import { freeAtoms } from '../../domain/placer.ts';
import type { DeviceClass } from '../../domain/reservation-request.ts';
import { cachedHorizonMs } from './placement.ts';
import { loadPlacerNodes, sampleNodeIds } from './placement-load.ts';

type Trx = Transaction<Database>;

/**
 * The pool-lease batch's candidates for one device class, through the placer's node cache (the
 * inline placer's, core/placer-node-cache.ts): the warm nodes (those this process booked or read
 * last: partly used, the tight fits best fit wants) and a random sample of the pool's schedulable
 * nodes sized to the demand the warm ones cannot take, each from the cache when it has the node's
 * bookings over the horizon, the rest read in one statement (loadPlacerNodes) and cached.
 * A heuristic input only: the batch books under the per-device locks and re-checks there the
 * node, its atoms and labels as the plan saw them (bookPlannedAllocations' `verify`), and the
 * EXCLUDE constraint has the last word. Answers working copies, which the planner may book in
 * memory without touching the cache.
 */
export async function batchCandidates(
  trx: Trx,
  input: {
    poolId: string;
    deviceClass: DeviceClass;
    horizon: Interval;
    /** The batch's requests still to place (their atoms size the sample). */
    requests: ReadonlyArray<{ request: PlacementRequest; window: Interval }>;
    /** 0 for the first look; each further round samples four times as many nodes. */
    round: number;
    /** Nodes not to answer again (already candidates of this batch). */
    excludeNodeIds: ReadonlySet<string>;
    caches: AdmissionCaches;
  },
): Promise<PlacerNode[]> {
  const { poolId, deviceClass, horizon, caches } = input;
  const cache = caches.placerNodes;
  const warm = cache.lookup(poolId, deviceClass, cache.warmNodes(poolId), horizon).cached;
  const demand = input.requests.reduce((n, r) => n + r.request.count, 0);
  // What the warm nodes could take at most (free atoms, whatever their topology, in whole requests
  // of the smallest size: a node this process booked down to 3 free atoms takes no request of 4,
  // and counting its atoms left the sample at 8 nodes while most requests fell back to the inline
  // placer one by one): the sample makes up the rest, assuming two free atoms a node.
  const smallest = Math.max(1, Math.min(...input.requests.map((r) => r.request.count)));
  const warmRoom = warm.reduce(
    (n, node) => n + Math.floor(freeAtoms(node, input.requests[0]!.request, horizon) / smallest) * smallest,
    0,
  );
  const sampleSize = (8 + Math.ceil(Math.max(0, demand - warmRoom) / 2)) * 4 ** input.round;
  const sampled = await sampleNodeIds(trx, poolId, caches, sampleSize);
  const ids = [...new Set([...(input.round === 0 ? warm.map((n) => n.id) : []), ...sampled])].filter(
    (id) => !input.excludeNodeIds.has(id),
  );
  const { cached, missing } = cache.lookup(poolId, deviceClass, ids, horizon);
  let read: PlacerNode[] = [];
  if (missing.length > 0) {
    const readHorizon = { start: horizon.start, end: horizon.end + cachedHorizonMs };
    read = await loadPlacerNodes(trx, { poolId, deviceClass, horizon: readHorizon, sample: missing });
    cache.store(poolId, deviceClass, read, readHorizon);
  }
  return [...cached, ...read].map(workingCopy);
}

/** A node whose bookings can be added to without changing the cached one. */
function workingCopy(node: PlacerNode): PlacerNode {
  const host: PlacerNode['host'] = {};
  for (const [resource, row] of Object.entries(node.host)) {
    host[resource as keyof PlacerNode['host']] = { ...row, bookings: [...row.bookings] };
  }
  return { ...node, devices: node.devices.map((d) => ({ ...d, bookings: [...d.bookings] })), host };
}
