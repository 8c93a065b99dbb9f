import { sql, type Transaction } from 'kysely';
import type { AdmissionCaches } from '../../core/admission-caches.ts';
import type { Database } from '../../core/database.ts';
import { endedAllocationStates } from '../../domain/fleet.ts';
import type { Interval, PlacerNode } from '../../domain/placer.ts';
import type { DeviceClass, HostResourceAmounts } from '../../domain/reservation-request.ts';
import { preparedMarker } from '../pool.ts';
import { literalList } from '../sql-literals.ts';
import { bookingOfDevice, hostBookingOfNode } from './bookings.ts';
import { sampleNodeIds } from './placement-load.ts';

type Trx = Transaction<Database>;

/**
 * The pool-lease batch's candidate read: one read of a pool's nodes for a whole batch, in three
 * flat statements (no per-node JSON): the nodes with their atoms of one class, the atoms' bookings
 * over the batch's horizon, and the labels, host-resource rows and scalar bookings of those nodes.
 * Which nodes: a random sample of the pool's schedulable nodes (from admission's cached list) sized
 * to the batch's demand, plus the nodes of the newest live allocations (likely partly used: the
 * tight fits best fit wants). A heuristic input only: the batch books under the per-device locks,
 * re-checks under them, and the EXCLUDE constraint has the last word.
 */
export async function loadBatchCandidates(
  trx: Trx,
  input: {
    poolId: string;
    deviceClass: DeviceClass;
    horizon: Interval;
    /** How many schedulable nodes to sample. */
    sampleSize: number;
    /** Adds the nodes of this many newest live allocations. */
    recentAllocations: number;
    /** Nodes not to read again (already candidates of this batch). */
    excludeNodeIds?: ReadonlySet<string>;
    caches?: AdmissionCaches;
  },
): Promise<PlacerNode[]> {
  const sampled = (await sampleNodeIds(trx, input.poolId, input.caches, input.sampleSize)).filter(
    (id) => !input.excludeNodeIds?.has(id),
  );
  const excluded = [...(input.excludeNodeIds ?? [])];
  const horizon = sql`tstzrange(${new Date(input.horizon.start).toISOString()}::timestamptz,
    ${new Date(input.horizon.end).toISOString()}::timestamptz, '[)')`;
  const { rows: nodeRows } = await sql<{
    id: string;
    name: string;
    ready: boolean;
    cordoned: boolean;
    maintenance: boolean;
    draining: boolean;
    connected: boolean;
    converged: boolean;
    no_schedule: string | null;
    device_id: string | null;
    attributes: Record<string, unknown> | null;
    healthy: boolean | null;
  }>`${sql.raw(preparedMarker)}
    WITH candidates AS MATERIALIZED (
      SELECT n.* FROM nodes n
      WHERE n.pool_id = ${input.poolId}
        AND n.id IN (
          SELECT unnest(${sampled}::text[])
          UNION
          SELECT a.node_id FROM (
            SELECT node_id FROM allocations WHERE state NOT IN (${literalList(endedAllocationStates)})
            ORDER BY created_at DESC LIMIT ${input.recentAllocations}) a)
        AND n.id <> ALL(${excluded}::text[])
    )
    SELECT n.id, n.name, n.provision_state = 'ready' AS ready, n.cordoned, n.maintenance, n.draining,
           n.connectivity = 'connected' AS connected, COALESCE(n.observed_generation, 0) >= 1 AS converged,
           (SELECT c.type FROM node_conditions c WHERE c.node_id = n.id AND c.effect = 'NoSchedule'
             ORDER BY c.type = 'NodeUnreachable', c.type LIMIT 1) AS no_schedule,
           d.id AS device_id, d.attributes, d.health = 'healthy' AS healthy
    FROM candidates n
    LEFT JOIN devices d ON d.node_id = n.id AND d.class = ${input.deviceClass} AND d.bookable
      AND d.removed_at IS NULL AND d.bookable_from_generation <= COALESCE(n.observed_generation, 0)
    ORDER BY n.name`.execute(trx);
  const nodes = new Map<string, PlacerNode>();
  const devices = new Map<string, PlacerNode['devices'][number]>();
  for (const r of nodeRows) {
    let node = nodes.get(r.id);
    if (!node) {
      node = {
        id: r.id,
        name: r.name,
        ready: r.ready,
        cordoned: r.cordoned,
        maintenance: r.maintenance,
        draining: r.draining,
        connected: r.connected,
        converged: r.converged,
        noSchedule: r.no_schedule,
        labels: {},
        devices: [],
        host: {},
      };
      nodes.set(r.id, node);
    }
    if (r.device_id) {
      const device = {
        id: r.device_id,
        class: input.deviceClass,
        attributes: r.attributes ?? {},
        healthy: r.healthy === true,
        bookings: [],
      };
      node.devices.push(device);
      devices.set(device.id, device);
    }
  }
  if (nodes.size === 0) return [];
  const nodeIds = [...nodes.keys()];
  // Every booking of these atoms over the horizon (the constraint's own table, found through its
  // gist index one atom at a time), whatever its allocation's state.
  const { rows: bookings } = await sql<{ d: string; s: Date; e: Date }>`${sql.raw(preparedMarker)}
    SELECT b.device_id AS d, lower(b.during) AS s, upper(b.during) AS e
    FROM unnest(${[...devices.keys()]}::text[]) AS t(id)
    JOIN device_bookings b ON ${bookingOfDevice('b', sql.ref('t.id'))} AND b.during && ${horizon}`.execute(
    trx,
  );
  for (const b of bookings) devices.get(b.d)?.bookings.push({ start: b.s.getTime(), end: b.e.getTime() });
  const { rows: extras } = await sql<{
    k: 'label' | 'host' | 'scalar';
    node_id: string;
    key: string;
    value: string | null;
    s: Date | null;
    e: Date | null;
  }>`${sql.raw(preparedMarker)}
    SELECT 'label' AS k, l.node_id, l.key, l.value, NULL::timestamptz AS s, NULL::timestamptz AS e
      FROM node_labels l
     WHERE l.node_id = ANY(${nodeIds}::text[]) AND (l.key NOT LIKE 'bc.dev/%' OR l.source = 'system')
    UNION ALL
    SELECT 'host', h.node_id, h.resource, h.allocatable::text, NULL, NULL
      FROM host_resources h
     WHERE h.node_id = ANY(${nodeIds}::text[]) AND h.resource IN ('vcpu', 'memoryGiB', 'hugepages1Gi')
    UNION ALL
    SELECT 'scalar', s.node_id, s.resource, s.amount::text, lower(s.during), upper(s.during)
      FROM unnest(${nodeIds}::text[]) AS t(id)
      JOIN scalar_bookings s ON ${hostBookingOfNode('s', sql.ref('t.id'))} AND s.resource IN ('vcpu', 'memoryGiB', 'hugepages1Gi')
       AND s.during && ${horizon}
    UNION ALL
    SELECT 'scalar', s.node_id, s.resource, s.amount::text, lower(s.during), upper(s.during)
      FROM unnest(${nodeIds}::text[]) AS t(id)
      JOIN hold_bookings s ON ${hostBookingOfNode('s', sql.ref('t.id'))} AND s.resource IN ('vcpu', 'memoryGiB', 'hugepages1Gi')
       AND s.during && ${horizon}
    ORDER BY k`.execute(trx);
  // 'host' rows sort before 'scalar' ones, so each scalar booking finds its row. (Scalar bookings
  // are joined one node at a time: their gist index takes no array of node ids.)
  for (const x of extras) {
    const node = nodes.get(x.node_id)!;
    const resource = x.key as keyof HostResourceAmounts;
    if (x.k === 'label') node.labels[x.key] = x.value ?? '';
    else if (x.k === 'host') node.host[resource] = { allocatable: Number(x.value), bookings: [] };
    else
      node.host[resource]?.bookings.push({
        start: x.s!.getTime(),
        end: x.e!.getTime(),
        amount: Number(x.value),
      });
  }
  return [...nodes.values()];
}
