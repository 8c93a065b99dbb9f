import type { ResourceRef } from '../core/iam-port.ts';
import { ComputeError } from '../domain/errors.ts';
import type { MethodContext } from './method.ts';

/**
 * Who may see and operate a node: the root tenant's administrators, and the tenant that owns the
 * node's pool. Anyone else gets NOT_FOUND before IAM is asked, the same answer whether or not the
 * node exists; then IAM decides the action once on `compute-node/<id>`.
 */
export async function requireNode(
  ctx: MethodContext,
  nodeId: string,
  action: string,
): Promise<{ id: string; poolId: string | null; tenantId: string }> {
  const node = await ctx.deps.db
    .selectFrom('nodes as n')
    .leftJoin('pools as p', 'p.id', 'n.pool_id')
    .select(['n.id', 'n.pool_id', 'p.owner_tenant_id'])
    .where('n.id', '=', nodeId)
    .executeTakeFirst();
  const owner = node?.owner_tenant_id ?? null;
  if (!node || (!ctx.principal.rootAdmin && owner !== ctx.principal.tenantId)) {
    throw new ComputeError('NOT_FOUND', `node ${nodeId} not found`);
  }
  const tenantId = owner ?? ctx.principal.tenantId;
  const resource: ResourceRef = {
    type: 'compute-node',
    id: node.id,
    tenantId,
    parent: node.pool_id ? { type: 'compute-pool', id: node.pool_id } : null,
  };
  await ctx.deps.iam.require(ctx.principal, action, resource, { requestId: ctx.requestId });
  return { id: node.id, poolId: node.pool_id, tenantId };
}

/** A pool the caller may manage nodes of (root admin, or the owning tenant); NOT_FOUND otherwise. */
export async function requirePool(
  ctx: MethodContext,
  poolId: string,
  action: string,
): Promise<{ id: string; tenantId: string }> {
  const pool = await ctx.deps.db
    .selectFrom('pools')
    .select(['id', 'owner_tenant_id', 'archived_at'])
    .where('id', '=', poolId)
    .executeTakeFirst();
  if (!pool || (!ctx.principal.rootAdmin && pool.owner_tenant_id !== ctx.principal.tenantId)) {
    throw new ComputeError('NOT_FOUND', `pool ${poolId} not found`);
  }
  await ctx.deps.iam.require(
    ctx.principal,
    action,
    { type: 'compute-pool', id: pool.id, tenantId: pool.owner_tenant_id },
    { requestId: ctx.requestId },
  );
  return { id: pool.id, tenantId: pool.owner_tenant_id };
}

/** Lists are decided once on the caller's tenant. */
export async function requireTenantRead(ctx: MethodContext, action: string): Promise<void> {
  await ctx.deps.iam.require(
    ctx.principal,
    action,
    { type: 'compute-tenant', id: ctx.principal.tenantId, tenantId: ctx.principal.tenantId },
    { requestId: ctx.requestId },
  );
}
