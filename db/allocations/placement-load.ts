import { sql } from 'kysely';
import type { AdmissionCaches } from '../../core/admission-caches.ts';
import type { Db } from '../../core/database.ts';
import { endedAllocationStates } from '../../domain/fleet.ts';
import type { Interval, PlacerNode } from '../../domain/placer.ts';
import type { DeviceClass, HostResourceAmounts } from '../../domain/reservation-request.ts';
import { preparedMarker } from '../pool.ts';
import { literalList } from '../sql-literals.ts';
import { hostBookingOfNode } from './bookings.ts';

/**
 * The placer's reads, in one place: nodes of a pool with their atoms of one class, the bookings
 * over a horizon, labels that count and host resources. Bookings are found through live
 * allocations (indexed by window), so a pool of 10,000 nodes is not scanned device by device.
 */

const range = (w: Interval) =>
  sql`tstzrange(${new Date(w.start).toISOString()}::timestamptz, ${new Date(w.end).toISOString()}::timestamptz, '[)')`;

/** A node `n` the placer may book: ready, connected, converged, not fenced off in any way. */
export const schedulable = sql`n.provision_state = 'ready' AND NOT n.cordoned AND NOT n.maintenance AND NOT n.draining
  AND n.connectivity = 'connected' AND COALESCE(n.observed_generation, 0) >= 1
  AND NOT EXISTS (SELECT 1 FROM node_conditions c WHERE c.node_id = n.id AND c.effect = 'NoSchedule')`;

/**
 * The ids of a pool's schedulable nodes, through `caches.schedulable` when given (a heuristic
 * input only: every candidate is re-read, and the booking is decided under locks and the
 * constraint); read fresh without caches.
 */
export async function schedulableNodeIds(
  db: Db,
  poolId: string,
  caches?: AdmissionCaches,
): Promise<string[]> {
  const read = async (executor: Db) => {
    const { rows } = await sql<{
      id: string;
    }>`SELECT n.id FROM nodes n WHERE n.pool_id = ${poolId} AND ${schedulable}`.execute(executor);
    return rows.map((r) => r.id);
  };
  if (!caches) return read(db);
  // Outside a transaction, one read serves every concurrent caller once the entry expires; a
  // transaction's read stays its own (its failure must not become other callers' error).
  if (!db.isTransaction) return caches.schedulable.load(poolId, () => read(db));
  const hit = caches.schedulable.get(poolId);
  if (hit) return hit;
  const ids = await read(db);
  caches.schedulable.set(poolId, ids);
  return ids;
}

/** A random sample of a pool's schedulable node ids (from the cached list). */
export async function sampleNodeIds(
  db: Db,
  poolId: string,
  caches?: AdmissionCaches,
  size = 8,
): Promise<string[]> {
  const all = await schedulableNodeIds(db, poolId, caches);
  if (all.length <= size) return all;
  const ids = new Set<string>();
  while (ids.size < size) ids.add(all[Math.floor(Math.random() * all.length)]!);
  return [...ids];
}

/** A node as the query returns it: the placer's flags as they are, the rest as JSON to unfold. */
interface NodeRow
  extends Pick<
    PlacerNode,
    'id' | 'name' | 'ready' | 'cordoned' | 'maintenance' | 'draining' | 'connected' | 'converged'
  > {
  no_schedule: string | null;
  labels: Record<string, string> | null;
  devices: Array<{ id: string; a: Record<string, unknown>; h: boolean }> | null;
  bookings: Array<{ d: string; s: string; e: string }> | null;
  host: Record<string, string> | null;
  scalars: Array<{ r: string; n: string; s: string; e: string }> | null;
}

/**
 * Loads nodes of a pool (all of them, or a sample) as the placer sees them, with their atoms of
 * `deviceClass` and every booking overlapping `horizon`, in one round trip.
 */
export async function loadPlacerNodes(
  db: Db,
  input: {
    poolId: string;
    deviceClass: DeviceClass;
    horizon: Interval;
    /** Only these nodes. */
    sample?: readonly string[];
  },
): Promise<PlacerNode[]> {
  const only = input.sample ? sql`AND n.id = ANY(${input.sample as string[]}::text[])` : sql``;
  const horizon = range(input.horizon);
  const start = new Date(input.horizon.start).toISOString();
  const end = new Date(input.horizon.end).toISOString();
  const { rows } = await sql<NodeRow>`${sql.raw(preparedMarker)}
    SELECT n.id, n.name, n.provision_state = 'ready' AS ready, n.cordoned, n.maintenance, n.draining,
           n.connectivity = 'connected' AS connected, COALESCE(n.observed_generation, 0) >= 1 AS converged,
           -- NodeUnreachable last: the machine placer excuses it on powered-off machines, so any
           -- other NoSchedule condition (an operator's taint) beside it must be the one it sees.
           (SELECT c.type FROM node_conditions c WHERE c.node_id = n.id AND c.effect = 'NoSchedule'
             ORDER BY c.type = 'NodeUnreachable', c.type LIMIT 1) AS no_schedule,
           (SELECT json_object_agg(l.key, l.value) FROM node_labels l
             WHERE l.node_id = n.id AND (l.key NOT LIKE 'bc.dev/%' OR l.source = 'system')) AS labels,
           (SELECT json_agg(json_build_object('id', d.id, 'a', d.attributes, 'h', d.health = 'healthy')) FROM devices d
             WHERE d.node_id = n.id AND d.class = ${input.deviceClass} AND d.bookable AND d.removed_at IS NULL
               -- an atom a new NodeSpec generation made counts once the node reported converging it
               AND d.bookable_from_generation <= COALESCE(n.observed_generation, 0)) AS devices,
           -- Through the node's live allocations only: the horizon is tested on the bounds, not
           -- with &&, which the planner would answer from the EXCLUDE index across every device's
           -- bookings (a cost growing with the fleet's live reservations). The allocation's own
           -- window is not tested: a leased machine's bookings outlast it (the turnaround).
           (SELECT json_agg(json_build_object('d', b.device_id, 's', lower(b.during), 'e', upper(b.during)))
              FROM allocations a JOIN device_bookings b ON b.allocation_id = a.id
             WHERE a.node_id = n.id AND a.state NOT IN (${literalList(endedAllocationStates)})
               AND upper(b.during) > ${start}::timestamptz AND lower(b.during) < ${end}::timestamptz) AS bookings,
           (SELECT json_object_agg(h.resource, h.allocatable) FROM host_resources h
             WHERE h.node_id = n.id AND h.resource IN ('vcpu', 'memoryGiB', 'hugepages1Gi')) AS host,
           (SELECT json_agg(json_build_object('r', s.resource, 'n', s.amount, 's', lower(s.during), 'e', upper(s.during)))
              FROM (SELECT node_id, resource, amount, during FROM scalar_bookings
                    UNION ALL SELECT node_id, resource, amount, during FROM hold_bookings) s
             WHERE ${hostBookingOfNode('s', sql.ref('n.id'), sql`lower(${horizon})`)} AND s.resource IN ('vcpu', 'memoryGiB', 'hugepages1Gi')
               AND s.during && ${horizon}) AS scalars
    FROM nodes n WHERE n.pool_id = ${input.poolId} ${only} ORDER BY n.name`.execute(db);
  return rows.map((n) => {
    const byDevice = new Map<string, Interval[]>();
    for (const b of n.bookings ?? []) {
      const list = byDevice.get(b.d) ?? [];
      list.push({ start: Date.parse(b.s), end: Date.parse(b.e) });
      byDevice.set(b.d, list);
    }
    const host: PlacerNode['host'] = {};
    for (const [resource, allocatable] of Object.entries(n.host ?? {})) {
      host[resource as keyof HostResourceAmounts] = { allocatable: Number(allocatable), bookings: [] };
    }
    for (const s of n.scalars ?? []) {
      host[s.r as keyof HostResourceAmounts]?.bookings.push({
        start: Date.parse(s.s),
        end: Date.parse(s.e),
        amount: Number(s.n),
      });
    }
    return {
      id: n.id,
      name: n.name,
      ready: n.ready,
      cordoned: n.cordoned,
      maintenance: n.maintenance,
      draining: n.draining,
      connected: n.connected,
      converged: n.converged,
      noSchedule: n.no_schedule,
      labels: n.labels ?? {},
      devices: (n.devices ?? []).map((d) => ({
        id: d.id,
        class: input.deviceClass,
        attributes: d.a,
        healthy: d.h,
        bookings: byDevice.get(d.id) ?? [],
      })),
      host,
    };
  });
}
