import type { IamAdminPort } from '../../core/iam-port.ts';
import { ComputeError } from '../../domain/errors.ts';
import type { IamAction } from '../../domain/iam-actions.ts';
import type { MethodContext } from '../method.ts';

/** The IAM's administration (`IamPort.admin`); UNSUPPORTED when this IAM is administered elsewhere. */
export function iamAdmin(ctx: MethodContext): IamAdminPort {
  const { admin } = ctx.deps.iam;
  if (!admin) {
    throw new ComputeError(
      'UNSUPPORTED',
      "this server's IAM is administered outside compute (a bridge to a remote IAM): manage tenants, identities, tokens, roles, policies and confirmations in that IAM",
    );
  }
  return admin;
}

/**
 * Admin methods are for the root tenant's administrators only: the principal must administer the
 * platform, and IAM decides `action` on the platform once.
 */
export async function requireRootAdmin(ctx: MethodContext, action: IamAction): Promise<void> {
  if (!ctx.principal.rootAdmin) {
    throw new ComputeError('ACCESS_DENIED', `${action} is for administrators of the root tenant only`);
  }
  await ctx.deps.iam.require(
    ctx.principal,
    action,
    { type: 'compute-platform', id: ctx.principal.tenantId, tenantId: ctx.principal.tenantId },
    { requestId: ctx.requestId },
  );
}

export const ms = (d: Date | null | undefined) => (d ? d.getTime() : null);
