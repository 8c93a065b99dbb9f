import { ComputeError } from '../../domain/errors.ts';
import type { EmbeddedIam } from '../../iam/embedded/index.ts';
import type { MethodContext } from '../method.ts';

/** The IAM administration behind the port; UNSUPPORTED when the IAM is not the embedded one. */
export function iamAdmin(ctx: MethodContext): EmbeddedIam['admin'] {
  const admin = (ctx.deps.iam as Partial<EmbeddedIam>).admin;
  if (!admin) {
    throw new ComputeError('UNSUPPORTED', 'this server uses a remote IAM: administer it there');
  }
  return admin;
}

/**
 * Admin methods are for the root tenant's administrators only: the principal must administer the
 * platform, and IAM decides `action` on the platform once.
 */
export async function requireRootAdmin(ctx: MethodContext, action: string): Promise<void> {
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
