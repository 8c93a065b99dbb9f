import { sql } from 'kysely';
import type { Db } from '../../core/database.ts';
import { endedAllocationStates } from '../../domain/fleet.ts';
import { literalList } from '../sql-literals.ts';

/** One pool's capacity as `capacity.get` answers it. */
export interface PoolCapacity {
  poolId: string;
  name: string;
  gpuModel: string;
  region: string;
  deviceClass: string;
  nodes: number;
  schedulableNodes: number;
  allocatable: number;
  allocated: number;
  reserved: number;
  available: number;
  quota: { limit: number; used: number };
}

/**
 * Per pool the tenant owns or is offered (not archived; one pool with `poolId`), by name: its
 * atoms of the pool's class on schedulable nodes (allocatable), those booked at compute_now()
 * (allocated), those with a booking that starts later (reserved), those free now (available), and
 * the tenant's quota for the class. Read-only.
 */
export async function readPoolCapacity(
  db: Db,
  input: { tenantId: string; poolId?: string | undefined },
): Promise<PoolCapacity[]> {
  const onlyPool = input.poolId ? sql`AND p.id = ${input.poolId}` : sql``;
  const { rows } = await sql<{
    id: string;
    name: string;
    gpu_model: string;
    region: string;
    class: string;
    nodes: string;
    schedulable_nodes: string;
    allocatable: string;
    allocated: string;
    reserved: string;
    available: string;
    quota_limit: string | null;
    quota_used: string | null;
  }>`
    WITH visible AS (
      SELECT p.id, p.name, p.gpu_model, s.region,
             CASE p.sharing_mode WHEN 'exclusive' THEN 'gpu' WHEN 'mig' THEN 'gpu.mig' ELSE 'gpu.slot' END AS class
      FROM pools p JOIN sites s ON s.id = p.site_id
      WHERE p.archived_at IS NULL ${onlyPool}
        AND (p.owner_tenant_id = ${input.tenantId}
             OR EXISTS (SELECT 1 FROM pool_offers o WHERE o.pool_id = p.id AND o.tenant_id = ${input.tenantId}))
    ), atoms AS (
      SELECT v.id AS pool_id, d.id AS device_id,
             (n.provision_state = 'ready' AND NOT n.cordoned AND NOT n.maintenance AND NOT n.draining
              AND n.connectivity = 'connected' AND COALESCE(n.observed_generation, 0) >= 1 AND d.health = 'healthy'
              AND NOT EXISTS (SELECT 1 FROM node_conditions c WHERE c.node_id = n.id AND c.effect = 'NoSchedule')) AS ok
      FROM visible v JOIN nodes n ON n.pool_id = v.id
      JOIN devices d ON d.node_id = n.id AND d.class = v.class AND d.bookable AND d.removed_at IS NULL
        AND d.bookable_from_generation <= COALESCE(n.observed_generation, 0)
    ), booked AS (
      SELECT b.device_id, bool_or(b.during @> compute_now()) AS now, bool_or(lower(b.during) > compute_now()) AS later
      FROM allocations a JOIN nodes n ON n.id = a.node_id JOIN visible v ON v.id = n.pool_id
      JOIN device_bookings b ON b.allocation_id = a.id
      WHERE a.state NOT IN (${literalList(endedAllocationStates)}) AND upper(a.during) > compute_now() AND upper(b.during) > compute_now()
      GROUP BY b.device_id
    )
    SELECT v.id, v.name, v.gpu_model, v.region, v.class,
           (SELECT count(*) FROM nodes n WHERE n.pool_id = v.id) AS nodes,
           (SELECT count(*) FROM nodes n WHERE n.pool_id = v.id AND n.provision_state = 'ready' AND NOT n.cordoned
              AND NOT n.maintenance AND NOT n.draining AND n.connectivity = 'connected'
              AND COALESCE(n.observed_generation, 0) >= 1) AS schedulable_nodes,
           count(*) FILTER (WHERE a.ok) AS allocatable,
           count(*) FILTER (WHERE bk.now) AS allocated,
           count(*) FILTER (WHERE bk.later) AS reserved,
           count(*) FILTER (WHERE a.ok AND NOT COALESCE(bk.now, false)) AS available,
           (SELECT limit_amount FROM quotas q WHERE q.tenant_id = ${input.tenantId} AND q.pool_id = v.id AND q.resource = v.class) AS quota_limit,
           (SELECT used FROM quotas q WHERE q.tenant_id = ${input.tenantId} AND q.pool_id = v.id AND q.resource = v.class) AS quota_used
    FROM visible v LEFT JOIN atoms a ON a.pool_id = v.id LEFT JOIN booked bk ON bk.device_id = a.device_id
    GROUP BY v.id, v.name, v.gpu_model, v.region, v.class
    ORDER BY v.name`.execute(db);
  return rows.map((r) => ({
    poolId: r.id,
    name: r.name,
    gpuModel: r.gpu_model,
    region: r.region,
    deviceClass: r.class,
    nodes: Number(r.nodes),
    schedulableNodes: Number(r.schedulable_nodes),
    allocatable: Number(r.allocatable),
    allocated: Number(r.allocated),
    reserved: Number(r.reserved),
    available: Number(r.available),
    quota: { limit: Number(r.quota_limit ?? 0), used: Number(r.quota_used ?? 0) },
  }));
}
