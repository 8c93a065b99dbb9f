import { sql } from 'kysely';
import type { Db } from '../../core/database.ts';
import { endedAllocationStates } from '../../domain/fleet.ts';
import { literalList } from '../sql-literals.ts';
import { bookingOfDevice, hostBookingOfNode } from './bookings.ts';

/** A node as `capacity.nodes` reads it, with compute_now(). */
export interface NodeCapacityRow {
  id: string;
  name: string;
  pool_id: string;
  class: string;
  provision_state: string;
  cordoned: boolean;
  cordon_reason: string | null;
  draining: boolean;
  maintenance: boolean;
  maintenance_reason: string | null;
  connectivity: string;
  observed_generation: string | null;
  last_heartbeat_at: Date | null;
  now: Date;
  devices_reported: boolean;
}

/** What `capacity.nodes` reads for one page of nodes. */
export interface NodeCapacityPage {
  page: NodeCapacityRow[];
  /** Whether a further page exists. */
  more: boolean;
  gpus: Array<{ node_id: string; class: string; total: string; free: string; reserved: string }>;
  scalars: Array<{ node_id: string; resource: string; allocatable: string; now: string; later: string }>;
  conditions: Array<{ node_id: string; type: string; reason: string }>;
}

/**
 * One page of the nodes of the pools the tenant owns or is offered (not archived; one pool with
 * `poolId`), by name then id after `cursor`, with what their live bookings leave: per node and
 * class the bookable atoms, those healthy and free at compute_now(), those with a booking that
 * starts later; per node the vCPU and memory allocatable, booked now and booked later; and the
 * NoSchedule conditions. Read-only.
 */
export async function readNodeCapacity(
  db: Db,
  input: { tenantId: string; poolId?: string | undefined; limit: number; cursor?: string | undefined },
): Promise<NodeCapacityPage> {
  const { rows } = await sql<NodeCapacityRow>`
    SELECT n.id, n.name, n.pool_id,
           CASE p.sharing_mode WHEN 'exclusive' THEN 'gpu' WHEN 'mig' THEN 'gpu.mig' ELSE 'gpu.slot' END AS class,
           n.provision_state, n.cordoned, n.cordon_reason, n.draining, n.maintenance, n.maintenance_reason,
           n.connectivity, n.observed_generation, n.last_heartbeat_at, compute_now() AS now,
           (EXISTS (SELECT 1 FROM devices d WHERE d.node_id = n.id)
            OR EXISTS (SELECT 1 FROM inventory_snapshots i WHERE i.node_id = n.id)) AS devices_reported
    FROM nodes n JOIN pools p ON p.id = n.pool_id
    WHERE p.archived_at IS NULL
      AND (p.owner_tenant_id = ${input.tenantId}
           OR EXISTS (SELECT 1 FROM pool_offers o WHERE o.pool_id = p.id AND o.tenant_id = ${input.tenantId}))
      AND (${input.poolId ?? null}::text IS NULL OR p.id = ${input.poolId ?? null})
      AND (${input.cursor ?? null}::text IS NULL
           OR (n.name, n.id) > (SELECT c.name, c.id FROM nodes c WHERE c.id = ${input.cursor ?? null}))
    ORDER BY n.name, n.id
    LIMIT ${input.limit + 1}`.execute(db);
  const page = rows.slice(0, input.limit);
  const ids = page.map((r) => r.id);
  const more = rows.length > input.limit;
  if (ids.length === 0) return { page, more, gpus: [], scalars: [], conditions: [] };
  // Live bookings: allocations not ended, bookings that hold now (free) or start later (reserved).
  const [gpus, scalars, conditions] = await Promise.all([
    sql<NodeCapacityPage['gpus'][number]>`
      SELECT d.node_id, d.class, count(*) AS total,
             count(*) FILTER (WHERE d.health = 'healthy' AND NOT EXISTS (
               SELECT 1 FROM device_bookings b JOIN allocations a ON a.id = b.allocation_id
               WHERE ${bookingOfDevice('b', sql.ref('d.id'))} AND a.state NOT IN (${literalList(endedAllocationStates)}) AND b.during @> compute_now())) AS free,
             count(*) FILTER (WHERE EXISTS (
               SELECT 1 FROM device_bookings b JOIN allocations a ON a.id = b.allocation_id
               WHERE ${bookingOfDevice('b', sql.ref('d.id'))} AND a.state NOT IN (${literalList(endedAllocationStates)}) AND lower(b.during) > compute_now())) AS reserved
      FROM devices d
      WHERE d.node_id = ANY(${ids}::text[]) AND d.bookable AND d.removed_at IS NULL
      GROUP BY d.node_id, d.class`.execute(db),
    sql<NodeCapacityPage['scalars'][number]>`
      SELECT h.node_id, h.resource, h.allocatable,
             COALESCE(sum(sb.amount) FILTER (WHERE sb.during @> compute_now()), 0) AS now,
             COALESCE(sum(sb.amount) FILTER (WHERE lower(sb.during) > compute_now()), 0) AS later
      FROM host_resources h
      LEFT JOIN scalar_bookings sb ON ${hostBookingOfNode('sb', sql.ref('h.node_id'), sql`compute_now()`)} AND sb.resource = h.resource
        AND EXISTS (SELECT 1 FROM allocations a WHERE a.id = sb.allocation_id AND a.state NOT IN (${literalList(endedAllocationStates)}))
      WHERE h.node_id = ANY(${ids}::text[]) AND h.resource IN ('vcpu', 'memoryGiB')
      GROUP BY h.node_id, h.resource, h.allocatable`.execute(db),
    db
      .selectFrom('node_conditions')
      .select(['node_id', 'type', 'reason'])
      .where('node_id', 'in', ids)
      .where('effect', '=', 'NoSchedule')
      .orderBy('type')
      .execute(),
  ]);
  return { page, more, gpus: gpus.rows, scalars: scalars.rows, conditions };
}
