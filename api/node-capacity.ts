import { z } from 'zod';
import { type NodeCapacityRow, readNodeCapacity } from '../db/allocations/node-capacity.ts';
import { tenantIdSchema } from '../domain/reservation-schema.ts';
import { defineMethod } from './method.ts';
import { requireOnTenant } from './reservations/access.ts';

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

const num = (v: string | number | null | undefined) => (v === null || v === undefined ? null : Number(v));

function refusalsOf(n: NodeCapacityRow, conditions: Array<{ type: string; reason: string }>): string[] {
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
    await requireOnTenant(ctx, input.tenantId, 'compute:capacity:read');
    const { page, more, gpus, scalars, conditions } = await readNodeCapacity(ctx.deps.db, input);
    return {
      nodes: page.map((n) => {
        const g = gpus.find((r) => r.node_id === n.id && r.class === n.class);
        const scalar = (resource: string) => {
          const s = scalars.find((r) => r.node_id === n.id && r.resource === resource);
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
      nextCursor: more ? page.at(-1)!.id : null,
    };
  },
});

/** `capacity.nodes`: the per-node view operators rely on (joined to the capacity group in the registry). */
export const nodeCapacityMethods = { nodes };
