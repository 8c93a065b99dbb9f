import type { Deps } from '../core/deps.ts';
import type { Principal } from '../core/iam-port.ts';

export const eventsReadAction = 'compute:events:read';

/**
 * Decides whether `principal` may read the events of `tenantId` (one IAM decision,
 * `compute:events:read` on the tenant). Without a tenant, a platform administrator reads every
 * tenant's events and the fleet's own (null tenant); anyone else reads their own tenant's.
 * Returns the tenant filter to apply (null: all).
 */
export async function authorizeEventRead(
  deps: Deps,
  principal: Principal,
  tenantId: string | undefined,
  requestId: string,
): Promise<string | null> {
  const scope = tenantId ?? (principal.rootAdmin ? null : principal.tenantId);
  const resourceTenant = scope ?? principal.tenantId;
  await deps.iam.require(
    principal,
    eventsReadAction,
    { type: 'compute-tenant', id: resourceTenant, tenantId: resourceTenant },
    { requestId },
  );
  return scope;
}
