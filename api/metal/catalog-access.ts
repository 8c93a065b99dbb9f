import { ComputeError } from '../../domain/errors.ts';
import type { IamAction } from '../../domain/iam-actions.ts';
import type { MethodContext } from '../method.ts';

/**
 * The tenant an image or profile call acts for: `tenantId` when given (the platform's
 * administrators may name any; a tenant only itself, NOT_FOUND otherwise), else the caller's.
 * One IAM decision on that tenant.
 */
export async function requireCatalogTenant(
  ctx: MethodContext,
  tenantId: string | undefined,
  action: IamAction,
): Promise<string> {
  const target = tenantId ?? ctx.principal.tenantId;
  if (!ctx.principal.rootAdmin && target !== ctx.principal.tenantId) {
    throw new ComputeError('NOT_FOUND', `tenant ${target} not found`);
  }
  await ctx.deps.iam.require(
    ctx.principal,
    action,
    { type: 'compute-tenant', id: target, tenantId: target },
    { requestId: ctx.requestId },
  );
  return target;
}
