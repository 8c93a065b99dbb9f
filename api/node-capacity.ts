import { sql } from 'kysely';
import { z } from 'zod';
import { tenantIdSchema } from '../domain/reservation-schema.ts';
import { defineMethod } from './method.ts';
import { preCheckTenant } from './reservations/access.ts';

/** Free, total and reserved amounts of one resource; null for what the node never reported. */
const amount = z.object({
  total: z.number().nullable(),
  free: z.number().nullable(),
  reserved: z.number().nullable(),
});

const nodeCapacity = z.object({
  nodeId: z.string(),
  name: z.string(),
  poolId: z.string(),
  acceptsWork: z.boolean(),
  /** Why it takes no new work (empty when it does): cordoned, draining, unreachable, a condition… */
  refusals: z.array(z.string()),
  gpus: amount,
  vcpu: amount,
  memoryGiB: amount,
  lastHeartbeatAt: z.number().nullable(),
  heartbeatAgeSeconds: z.number().nullable(),
});

interface NodeRow {
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

const num = (v: string | number | null | undefined) => (v === null || v === undefined ? null : Number(v));

function refusalsOf(n: NodeRow, conditions: Array<{ type: string; reason: string }>): string[] {
  const out: string[] = [];
  if (n.provision_state !== 'ready') out.push(`provisioning: ${n.provision_state}`);
  if (n.draining) out.push('draining');
  else if (n.cordoned) out.push(`cordoned${n.cordon_reason ? ` (${n.cordon_reason})` : ''}`);
  if (n.maintenance) out.push(`maintenance${n.maintenance_reason ? ` (${n.maintenance_reason})` : ''}`);
  if (n.connectivity !== 'connected')
    out.push(n.connectivity === 'unreachable' ? 'unreachable' : 'connectivity unknown');
  else if (num(n.observed_generation) === null || num(n.observed_generation)! < 1)
    out.push('desired state not applied yet');
  for (const c of conditions) {
    if (!out.some((r) => r.startsWith(c.type.toLowerCase()))) out.push(`${c.type}: ${c.reason}`);
  }
  return out;
}

const nodes = defineMethod({
  summary:
    'One row per node of the pools the tenant can use: whether it accepts work and why not, free, total and reserved GPUs, vCPUs and memory net of every live booking, and the age of its last heartbeat. A figure the node never reported is null, never zero.',
  action: 'compute:capacity:read',
  input: z.strictObject({
    tenantId: tenantIdSchema,
    poolId: z.string().min(1).max(100).optional(),
    limit: z.number().int().min(1).max(2000).default(500),
    /** The last node id of the previous page. */
    cursor: z.string().min(1).max(100).optional(),
  }),
  output: z.object({ nodes: z.array(nodeCapacity), nextCursor: z.string().nullable() }),
  handler: async (ctx, input) => {
    await preCheckTenant(ctx, input.tenantId);
    await ctx.deps.iam.require(
      ctx.principal,
      'compute:capacity:read',
      { type: 'compute-tenant', id: input.tenantId, tenantId: input.tenantId },
      { requestId: ctx.requestId },
    );
    const db = ctx.deps.db;
    const { rows } = await sql<NodeRow>`
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
    if (ids.length === 0) return { nodes: [], nextCursor: null };
    // Live bookings: allocations not ended, bookings that hold now (free) or start later (reserved).
    const [gpus, scalars, conditions] = await Promise.all([
      sql<{ node_id: string; class: string; total: string; free: string; reserved: string }>`
        SELECT d.node_id, d.class, count(*) AS total,
               count(*) FILTER (WHERE d.health = 'healthy' AND NOT EXISTS (
                 SELECT 1 FROM device_bookings b JOIN allocations a ON a.id = b.allocation_id
                 WHERE b.device_id = d.id AND a.state NOT IN ('released', 'failed') AND b.during @> compute_now())) AS free,
               count(*) FILTER (WHERE EXISTS (
                 SELECT 1 FROM device_bookings b JOIN allocations a ON a.id = b.allocation_id
                 WHERE b.device_id = d.id AND a.state NOT IN ('released', 'failed') AND lower(b.during) > compute_now())) AS reserved
        FROM devices d
        WHERE d.node_id = ANY(${ids}::text[]) AND d.bookable AND d.removed_at IS NULL
        GROUP BY d.node_id, d.class`.execute(db),
      sql<{ node_id: string; resource: string; allocatable: string; now: string; later: string }>`
        SELECT h.node_id, h.resource, h.allocatable,
               COALESCE(sum(sb.amount) FILTER (WHERE sb.during @> compute_now()), 0) AS now,
               COALESCE(sum(sb.amount) FILTER (WHERE lower(sb.during) > compute_now()), 0) AS later
        FROM host_resources h
        LEFT JOIN scalar_bookings sb ON sb.node_id = h.node_id AND sb.resource = h.resource
          AND EXISTS (SELECT 1 FROM allocations a WHERE a.id = sb.allocation_id AND a.state NOT IN ('released', 'failed'))
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
    return {
      nodes: page.map((n) => {
        const g = gpus.rows.find((r) => r.node_id === n.id && r.class === n.class);
        const scalar = (resource: string) => {
          const s = scalars.rows.find((r) => r.node_id === n.id && r.resource === resource);
          if (!s) return { total: null, free: null, reserved: null };
          return {
            total: Number(s.allocatable),
            free: Number(s.allocatable) - Number(s.now),
            reserved: Number(s.later),
          };
        };
        const refusals = refusalsOf(
          n,
          conditions.filter((c) => c.node_id === n.id),
        );
        return {
          nodeId: n.id,
          name: n.name,
          poolId: n.pool_id,
          acceptsWork: refusals.length === 0,
          refusals,
          gpus: n.devices_reported
            ? { total: num(g?.total) ?? 0, free: num(g?.free) ?? 0, reserved: num(g?.reserved) ?? 0 }
            : { total: null, free: null, reserved: null },
          vcpu: scalar('vcpu'),
          memoryGiB: scalar('memoryGiB'),
          lastHeartbeatAt: n.last_heartbeat_at?.getTime() ?? null,
          heartbeatAgeSeconds: n.last_heartbeat_at
            ? Math.max(0, Math.round((n.now.getTime() - n.last_heartbeat_at.getTime()) / 1000))
            : null,
        };
      }),
      nextCursor: rows.length > input.limit ? page.at(-1)!.id : null,
    };
  },
});

/** `capacity.nodes`: the per-node view operators rely on (joined to the capacity group in the registry). */
export const nodeCapacityMethods = { nodes };
