import { z } from 'zod';
import type { ResourceRef } from '../core/iam-port.ts';
import { findPool } from '../db/nodes/fleet.ts';
import { findNodeOwner } from '../db/nodes/nodes.ts';
import { ComputeError } from '../domain/errors.ts';
import type { IamAction } from '../domain/iam-actions.ts';
import type { MethodContext } from './method.ts';

/** Why an operator acts on a node (cordon, drain, retire, revoke): audited; some text, not only blanks. */
export const operatorReason = z.string().regex(/\S/, 'a reason with some text').trim().min(1).max(500);

/**
 * Who may see and operate a node: the root tenant's administrators, and the tenant that owns the
 * node's pool. Anyone else gets NOT_FOUND before IAM is asked, the same answer whether or not the
 * node exists; then IAM decides the action once on `compute-node/<id>`.
 */
export async function requireNode(
  ctx: MethodContext,
  nodeId: string,
  action: IamAction,
): Promise<{ id: string; poolId: string | null; tenantId: string }> {
  const node = await findNodeOwner(ctx.deps.db, nodeId);
  const owner = node?.ownerTenantId ?? null;
  if (!node || (!ctx.principal.rootAdmin && owner !== ctx.principal.tenantId)) {
    throw new ComputeError('NOT_FOUND', `node ${nodeId} not found`);
  }
  const tenantId = owner ?? ctx.principal.tenantId;
  const resource: ResourceRef = {
    type: 'compute-node',
    id: node.id,
    tenantId,
    parent: node.poolId ? { type: 'compute-pool', id: node.poolId } : null,
  };
  await ctx.deps.iam.require(ctx.principal, action, resource, { requestId: ctx.requestId });
  return { id: node.id, poolId: node.poolId, tenantId };
}

/** A pool the caller may manage nodes of (root admin, or the owning tenant); NOT_FOUND otherwise. */
export async function requirePool(
  ctx: MethodContext,
  poolId: string,
  action: IamAction,
): Promise<{ id: string; tenantId: string; archived: boolean }> {
  const pool = await findPool(ctx.deps.db, { id: poolId });
  if (!pool || (!ctx.principal.rootAdmin && pool.ownerTenantId !== ctx.principal.tenantId)) {
    throw new ComputeError('NOT_FOUND', `pool ${poolId} not found`);
  }
  await ctx.deps.iam.require(
    ctx.principal,
    action,
    { type: 'compute-pool', id: pool.id, tenantId: pool.ownerTenantId },
    { requestId: ctx.requestId },
  );
  return { id: pool.id, tenantId: pool.ownerTenantId, archived: pool.archived };
}

/** Lists are decided once on the caller's tenant. */
export async function requireTenantRead(ctx: MethodContext, action: IamAction): Promise<void> {
  await ctx.deps.iam.require(
    ctx.principal,
    action,
    { type: 'compute-tenant', id: ctx.principal.tenantId, tenantId: ctx.principal.tenantId },
    { requestId: ctx.requestId },
  );
}
