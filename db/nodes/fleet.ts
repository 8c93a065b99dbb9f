import { type Insertable, type Selectable, sql } from 'kysely';
import type { Db, PoolOffersTable, PoolsTable } from '../../core/database.ts';
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

/**
 * Offers a pool to a tenant with a quota per resource (a resource left out grants zero), and what
 * happens when the tenant's budget runs out (kept as it was when not given). Again: updates both.
 */
export async function offerPool(
  db: Db,
  input: {
    poolId: string;
    tenantId: string;
    quota: Record<string, number>;
    priority?: number | undefined;
    onBudgetExceeded?: OnBudgetExceeded | undefined;
  },
) {
  const budget = input.onBudgetExceeded ? { on_budget_exceeded: input.onBudgetExceeded } : {};
  await db.transaction().execute(async (trx) => {
    await trx
      .insertInto('pool_offers')
      .values({ pool_id: input.poolId, tenant_id: input.tenantId, priority: input.priority ?? 0, ...budget })
      .onConflict((oc) =>
        oc.columns(['pool_id', 'tenant_id']).doUpdateSet({ priority: input.priority ?? 0, ...budget }),
      )
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

type OnBudgetExceeded = Insertable<PoolOffersTable>['on_budget_exceeded'] & string;

export interface SiteRow {
  id: string;
  name: string;
  region: string;
}

/** A site by id or by name (names are unique), or null. */
export async function findSite(db: Db, by: { id: string } | { name: string }): Promise<SiteRow | null> {
  const query = db.selectFrom('sites').select(['id', 'name', 'region']);
  const row = await ('id' in by
    ? query.where('id', '=', by.id)
    : query.where('name', '=', by.name)
  ).executeTakeFirst();
  return row ?? null;
}

/** Every site, by name. */
export async function listAllSites(db: Db): Promise<SiteRow[]> {
  return db.selectFrom('sites').select(['id', 'name', 'region']).orderBy('name').execute();
}

export interface PoolRow {
  id: string;
  siteId: string;
  ownerTenantId: string;
  name: string;
  gpuModel: string;
  sharingMode: PoolSharingMode;
  policy: Record<string, unknown>;
  /** Raised by every policy change (admin.setPoolPolicy). */
  policyVersion: number;
  archived: boolean;
}

const poolColumns = [
  'id',
  'site_id',
  'owner_tenant_id',
  'name',
  'gpu_model',
  'sharing_mode',
  'policy',
  'policy_version',
  'archived_at',
] as const;

function poolRow(row: Pick<Selectable<PoolsTable>, (typeof poolColumns)[number]>): PoolRow {
  return {
    id: row.id,
    siteId: row.site_id,
    ownerTenantId: row.owner_tenant_id,
    name: row.name,
    gpuModel: row.gpu_model,
    sharingMode: row.sharing_mode,
    policy: row.policy,
    policyVersion: row.policy_version,
    archived: row.archived_at !== null,
  };
}

/** A pool by id, or by its owner and name (names are unique per owning tenant). */
export async function findPool(
  db: Db,
  by: { id: string } | { ownerTenantId: string; name: string },
): Promise<PoolRow | null> {
  const query = db.selectFrom('pools').select(poolColumns);
  const row = await ('id' in by
    ? query.where('id', '=', by.id)
    : query.where('owner_tenant_id', '=', by.ownerTenantId).where('name', '=', by.name)
  ).executeTakeFirst();
  return row ? poolRow(row) : null;
}

/** The ids of the pools a tenant owns. */
export async function listPoolIdsOwnedBy(db: Db, tenantId: string): Promise<string[]> {
  const rows = await db.selectFrom('pools').select('id').where('owner_tenant_id', '=', tenantId).execute();
  return rows.map((r) => r.id);
}

/** Every pool by name, with the tenants it is offered to (sorted). */
export async function listPoolsWithOffers(db: Db): Promise<Array<PoolRow & { offeredTo: string[] }>> {
  const rows = await db
    .selectFrom('pools as p')
    .select([
      'p.id',
      'p.site_id',
      'p.owner_tenant_id',
      'p.name',
      'p.gpu_model',
      'p.sharing_mode',
      'p.policy',
      'p.policy_version',
      'p.archived_at',
      sql<string[]>`ARRAY(SELECT tenant_id FROM pool_offers o WHERE o.pool_id = p.id ORDER BY tenant_id)`.as(
        'offered',
      ),
    ])
    .orderBy('p.name')
    .execute();
  return rows.map((r) => ({ ...poolRow(r), offeredTo: r.offered }));
}

/** A tenant's quotas: limit and used per pool and resource, by pool and resource. */
export async function listTenantQuotas(
  db: Db,
  tenantId: string,
): Promise<Array<{ poolId: string; resource: string; limit: number; used: number }>> {
  const rows = await db
    .selectFrom('quotas')
    .selectAll()
    .where('tenant_id', '=', tenantId)
    .orderBy('pool_id')
    .orderBy('resource')
    .execute();
  return rows.map((r) => ({
    poolId: r.pool_id,
    resource: r.resource,
    limit: Number(r.limit_amount),
    used: Number(r.used),
  }));
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
