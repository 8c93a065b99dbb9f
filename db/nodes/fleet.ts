import { sql } from 'kysely';
import type { Db } from '../../core/database.ts';
import type { HostResource, PoolClass, PoolSharingMode } from '../../domain/fleet.ts';
import { newId } from '../../domain/ids.ts';

export async function insertSite(db: Db, input: { name: string; region: string; id?: string }) {
  const id = input.id ?? newId('site');
  await db.insertInto('sites').values({ id, name: input.name, region: input.region }).execute();
  return id;
}

export async function insertPool(
  db: Db,
  input: {
    siteId: string;
    ownerTenantId: string;
    name: string;
    gpuModel: string;
    class?: PoolClass;
    sharingMode?: PoolSharingMode;
    policy?: Record<string, unknown>;
    id?: string;
  },
) {
  const id = input.id ?? newId('pool');
  await db
    .insertInto('pools')
    .values({
      id,
      site_id: input.siteId,
      owner_tenant_id: input.ownerTenantId,
      name: input.name,
      gpu_model: input.gpuModel,
      class: input.class ?? 'metal-host',
      sharing_mode: input.sharingMode ?? 'exclusive',
      policy: JSON.stringify(input.policy ?? {}),
    })
    .execute();
  return id;
}

/** Offers a pool to a tenant with a quota per resource (a resource left out grants zero). */
export async function offerPool(
  db: Db,
  input: { poolId: string; tenantId: string; quota: Record<string, number>; priority?: number },
) {
  await db.transaction().execute(async (trx) => {
    await trx
      .insertInto('pool_offers')
      .values({ pool_id: input.poolId, tenant_id: input.tenantId, priority: input.priority ?? 0 })
      .onConflict((oc) => oc.columns(['pool_id', 'tenant_id']).doUpdateSet({ priority: input.priority ?? 0 }))
      .execute();
    for (const [resource, limit] of Object.entries(input.quota)) {
      await trx
        .insertInto('quotas')
        .values({ tenant_id: input.tenantId, pool_id: input.poolId, resource, limit_amount: limit })
        .onConflict((oc) =>
          oc.columns(['tenant_id', 'pool_id', 'resource']).doUpdateSet({ limit_amount: limit }),
        )
        .execute();
    }
  });
}

/** The shape of one simulated GPU server. */
export interface NodeShape {
  gpus: number;
  gpuModel: string;
  gpuMemoryMiB: number;
  /** GPUs per NVLink domain; 8 puts all of them in one domain. */
  nvlinkDomainSize: number;
  numaNodes: number;
  resources: Partial<Record<HostResource, number>>;
}

export const h100Shape: NodeShape = {
  gpus: 8,
  gpuModel: 'h100',
  gpuMemoryMiB: 81_559,
  nvlinkDomainSize: 8,
  numaNodes: 2,
  resources: { vcpu: 192, memoryGiB: 2048, hugepages1Gi: 512 },
};

export interface RegisteredNode {
  id: string;
  name: string;
  deviceIds: string[];
}

/**
 * Registers `count` ready, connected, converged nodes of `shape` with their devices and host
 * resource rows, in bulk (10,000 nodes in a few seconds). The fleet for tests and benchmarks that
 * do not need live daemons; nodes that joined through the gateway are registered by JoinService.
 */
export async function registerReadyNodes(
  db: Db,
  input: { siteId: string; poolId: string; count: number; shape?: NodeShape; namePrefix?: string },
): Promise<RegisteredNode[]> {
  const shape = input.shape ?? h100Shape;
  const prefix = input.namePrefix ?? 'gpu';
  const nodes: RegisteredNode[] = [];
  const batch = 1_000;
  for (let offset = 0; offset < input.count; offset += batch) {
    const slice: RegisteredNode[] = [];
    const devices: { id: string; node: string; stable: string; attrs: string }[] = [];
    for (let i = offset; i < Math.min(input.count, offset + batch); i++) {
      const node: RegisteredNode = {
        id: newId('node'),
        name: `${prefix}-${String(i).padStart(5, '0')}`,
        deviceIds: [],
      };
      for (let g = 0; g < shape.gpus; g++) {
        const id = newId('dev');
        node.deviceIds.push(id);
        devices.push({
          id,
          node: node.id,
          stable: `GPU-${node.id.slice(5)}-${g}`,
          attrs: JSON.stringify({
            model: shape.gpuModel,
            memoryMiB: shape.gpuMemoryMiB,
            nvlinkDomain: `nvl-${Math.floor(g / shape.nvlinkDomainSize)}`,
            numaNode: Math.floor((g * shape.numaNodes) / shape.gpus),
            index: g,
          }),
        });
      }
      slice.push(node);
    }
    await db.transaction().execute(async (trx) => {
      await sql`
        INSERT INTO nodes (id, site_id, pool_id, name, provision_state, connectivity, spec_generation,
                           observed_generation, last_heartbeat_at, capabilities)
        SELECT id, ${input.siteId}, ${input.poolId}, name, 'ready', 'connected', 1, 1, compute_now(),
               ARRAY['devices.limits']
        FROM unnest(${slice.map((n) => n.id)}::text[], ${slice.map((n) => n.name)}::text[]) AS t(id, name)`.execute(
        trx,
      );
      await sql`
        INSERT INTO node_labels (node_id, key, value, source)
        SELECT id, 'bc.dev/cap.devices.limits', 'true', 'system' FROM unnest(${slice.map((n) => n.id)}::text[]) AS id`.execute(
        trx,
      );
      await sql`
        INSERT INTO devices (id, node_id, class, stable_id, attributes)
        SELECT id, node, 'gpu', stable, attrs::jsonb
        FROM unnest(${devices.map((d) => d.id)}::text[], ${devices.map((d) => d.node)}::text[],
                    ${devices.map((d) => d.stable)}::text[], ${devices.map((d) => d.attrs)}::text[])
          AS t(id, node, stable, attrs)`.execute(trx);
      const resources = Object.entries(shape.resources);
      if (resources.length > 0) {
        const rows = slice.flatMap((n) => resources.map(([r, v]) => ({ node: n.id, r, v: v ?? 0 })));
        await sql`
          INSERT INTO host_resources (node_id, resource, capacity, allocatable)
          SELECT node, r, v, v FROM unnest(${rows.map((x) => x.node)}::text[], ${rows.map((x) => x.r)}::text[],
                                           ${rows.map((x) => x.v)}::numeric[]) AS t(node, r, v)`.execute(trx);
      }
    });
    nodes.push(...slice);
  }
  return nodes;
}
