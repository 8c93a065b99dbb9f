import { sql } from 'kysely';
import type { Interval, PlacerNode } from '../domain/placer.ts';
import type { DeviceClass, HostResourceAmounts } from '../domain/reservation-request.ts';
import type { Db } from './pool.ts';

/**
 * The placer's reads, in one place: nodes of a pool with their atoms of one class, the bookings
 * over a horizon, labels that count and host resources. Bookings are found through live
 * allocations (indexed by window), so a pool of 10,000 nodes is not scanned device by device.
 */

const range = (w: Interval) =>
  sql`tstzrange(${new Date(w.start).toISOString()}::timestamptz, ${new Date(w.end).toISOString()}::timestamptz, '[)')`;

const schedulable = sql`n.provision_state = 'ready' AND NOT n.cordoned AND NOT n.maintenance AND NOT n.draining
  AND n.connectivity = 'connected' AND COALESCE(n.observed_generation, 0) >= 1
  AND NOT EXISTS (SELECT 1 FROM node_conditions c WHERE c.node_id = n.id AND c.effect = 'NoSchedule')`;

/** How many nodes a pool has (any state). */
export async function countPoolNodes(db: Db, poolId: string): Promise<number> {
  const { rows } = await sql<{
    n: string;
  }>`SELECT count(*) AS n FROM nodes WHERE pool_id = ${poolId}`.execute(db);
  return Number(rows[0]!.n);
}

/**
 * A bounded set of candidate node ids for a window: the nodes of the pool's most recent live
 * allocations overlapping it (likely partly used, the tight fits best fit wants) and a random
 * sample of schedulable nodes. A heuristic only: the loaded bookings, the locks and the EXCLUDE
 * constraint decide.
 */
export async function sampleCandidateNodeIds(
  db: Db,
  input: { poolId: string; window: Interval; recent?: number; random?: number },
): Promise<string[]> {
  const { rows } = await sql<{ id: string }>`
    (SELECT DISTINCT recent.node_id AS id FROM (
       SELECT a.node_id FROM allocations a JOIN nodes n ON n.id = a.node_id
       WHERE n.pool_id = ${input.poolId} AND a.state NOT IN ('released', 'failed') AND a.during && ${range(input.window)}
         AND ${schedulable}
       ORDER BY a.created_at DESC LIMIT ${input.recent ?? 64}) AS recent)
    UNION
    (SELECT n.id FROM nodes n WHERE n.pool_id = ${input.poolId} AND ${schedulable}
     ORDER BY random() LIMIT ${input.random ?? 32})`.execute(db);
  return rows.map((r) => r.id);
}

interface NodeRow {
  id: string;
  name: string;
  ready: boolean;
  cordoned: boolean;
  maintenance: boolean;
  draining: boolean;
  connected: boolean;
  converged: boolean;
  no_schedule: string | null;
  labels: Record<string, string> | null;
}

/**
 * Loads nodes of a pool (all of them, or `nodeIds`) as the placer sees them, with their atoms of
 * `deviceClass` and every booking overlapping `horizon`.
 */
export async function loadPlacerNodes(
  db: Db,
  input: { poolId: string; deviceClass: DeviceClass; horizon: Interval; nodeIds?: readonly string[] },
): Promise<PlacerNode[]> {
  const only = input.nodeIds ? sql`AND n.id = ANY(${input.nodeIds as string[]}::text[])` : sql``;
  if (input.nodeIds && input.nodeIds.length === 0) return [];
  const { rows: nodeRows } = await sql<NodeRow>`
    SELECT n.id, n.name, n.provision_state = 'ready' AS ready, n.cordoned, n.maintenance, n.draining,
           n.connectivity = 'connected' AS connected, COALESCE(n.observed_generation, 0) >= 1 AS converged,
           (SELECT c.type FROM node_conditions c WHERE c.node_id = n.id AND c.effect = 'NoSchedule' LIMIT 1) AS no_schedule,
           (SELECT jsonb_object_agg(l.key, l.value) FROM node_labels l
             WHERE l.node_id = n.id AND (l.key NOT LIKE 'bc.dev/%' OR l.source = 'system')) AS labels
    FROM nodes n WHERE n.pool_id = ${input.poolId} ${only} ORDER BY n.name`.execute(db);
  if (nodeRows.length === 0) return [];
  const ids = nodeRows.map((n) => n.id);
  const [devices, bookings, hosts, scalars] = await Promise.all([
    sql<{
      id: string;
      node_id: string;
      class: string;
      attributes: Record<string, unknown>;
      healthy: boolean;
    }>`
      SELECT d.id, d.node_id, d.class, d.attributes, d.health = 'healthy' AS healthy FROM devices d
      WHERE d.node_id = ANY(${ids}::text[]) AND d.class = ${input.deviceClass} AND d.bookable AND d.removed_at IS NULL`.execute(
      db,
    ),
    sql<{ device_id: string; s: Date; e: Date }>`
      SELECT b.device_id, lower(b.during) AS s, upper(b.during) AS e
      FROM allocations a JOIN device_bookings b ON b.allocation_id = a.id
      WHERE a.node_id = ANY(${ids}::text[]) AND a.state NOT IN ('released', 'failed')
        AND a.during && ${range(input.horizon)} AND b.during && ${range(input.horizon)}`.execute(db),
    sql<{ node_id: string; resource: string; allocatable: string }>`
      SELECT node_id, resource, allocatable FROM host_resources
      WHERE node_id = ANY(${ids}::text[]) AND resource IN ('vcpu', 'memoryGiB', 'hugepages1Gi')`.execute(db),
    sql<{ node_id: string; resource: string; amount: string; s: Date; e: Date }>`
      SELECT node_id, resource, amount, lower(during) AS s, upper(during) AS e FROM scalar_bookings
      WHERE node_id = ANY(${ids}::text[]) AND resource IN ('vcpu', 'memoryGiB', 'hugepages1Gi')
        AND during && ${range(input.horizon)}`.execute(db),
  ]);
  const byDevice = new Map<string, Interval[]>();
  for (const b of bookings.rows) {
    const list = byDevice.get(b.device_id) ?? [];
    list.push({ start: b.s.getTime(), end: b.e.getTime() });
    byDevice.set(b.device_id, list);
  }
  const nodes = new Map<string, PlacerNode>(
    nodeRows.map((n) => [
      n.id,
      {
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
        devices: [],
        host: {},
      },
    ]),
  );
  for (const d of devices.rows) {
    nodes.get(d.node_id)?.devices.push({
      id: d.id,
      class: d.class,
      attributes: d.attributes,
      healthy: d.healthy,
      bookings: byDevice.get(d.id) ?? [],
    });
  }
  for (const h of hosts.rows) {
    const node = nodes.get(h.node_id);
    if (node)
      node.host[h.resource as keyof HostResourceAmounts] = {
        allocatable: Number(h.allocatable),
        bookings: [],
      };
  }
  for (const s of scalars.rows) {
    nodes.get(s.node_id)?.host[s.resource as keyof HostResourceAmounts]?.bookings.push({
      start: s.s.getTime(),
      end: s.e.getTime(),
      amount: Number(s.amount),
    });
  }
  return [...nodes.values()];
}

/** Per pool id (ids are unique across databases): a transaction object is new for every call. */
const shareCache = new Map<string, { at: number; share: HostResourceAmounts }>();

/**
 * The pool's per-GPU share of host CPU and memory: `policy.perGpu` where set, otherwise the
 * smallest share any GPU host of the pool can give (allocatable ÷ physical GPUs), so it fits on
 * every host. Cached for 30 s per pool.
 */
export async function poolPerGpuShare(
  db: Db,
  pool: { id: string; policy: Record<string, unknown> },
): Promise<HostResourceAmounts> {
  const perGpu = (pool.policy.perGpu ?? {}) as Partial<HostResourceAmounts>;
  const cache = shareCache;
  if (cache.size > 10_000) cache.clear();
  const hit = cache.get(pool.id);
  let measured: HostResourceAmounts;
  if (hit && Date.now() - hit.at < 30_000) measured = hit.share;
  else {
    const { rows } = await sql<{ resource: string; share: string | null }>`
      SELECT h.resource, min(h.allocatable / g.n) AS share
      FROM nodes n
      JOIN LATERAL (SELECT count(*) AS n FROM devices d
                    WHERE d.node_id = n.id AND d.class = 'gpu' AND d.removed_at IS NULL) g ON g.n > 0
      JOIN host_resources h ON h.node_id = n.id AND h.resource IN ('vcpu', 'memoryGiB')
      WHERE n.pool_id = ${pool.id}
      GROUP BY h.resource`.execute(db);
    measured = { vcpu: 0, memoryGiB: 0, hugepages1Gi: 0 };
    for (const r of rows) measured[r.resource as 'vcpu' | 'memoryGiB'] = Number(r.share ?? 0);
    cache.set(pool.id, { at: Date.now(), share: measured });
  }
  return {
    vcpu: perGpu.vcpu ?? measured.vcpu,
    memoryGiB: perGpu.memoryGiB ?? measured.memoryGiB,
    hugepages1Gi: 0,
  };
}
