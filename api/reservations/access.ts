import { waitAtMost } from '../../core/bounded-wait.ts';
import type { ResourceRef } from '../../core/iam-port.ts';
import { admissionContext } from '../../db/events/audit.ts';
import { type CallerAudit, findTenantReservation } from '../../db/reservations/reservations.ts';
import { ComputeError } from '../../domain/errors.ts';
import type { IamAction } from '../../domain/iam-actions.ts';
import type { MethodContext } from '../method.ts';

/**
 * The tenant pre-check, before compute's database is read: a caller whose tenant is neither the
 * input tenant nor the root tenant is ACCESS_DENIED, the same answer whether or not anything exists.
 */
export async function preCheckTenant(ctx: MethodContext, tenantId: string): Promise<void> {
  const { principal } = ctx;
  if (principal.tenantId === tenantId || principal.rootAdmin) return;
  const root = await ctx.deps.iam.admin?.rootTenantId();
  if (root && principal.tenantId === root) return;
  throw new ComputeError(
    'ACCESS_DENIED',
    `tenantId: identity ${principal.identityId} of tenant ${principal.tenantId} cannot act for tenant ${tenantId}`,
  );
}

/** A reservation as IAM's resource (`compute-reservation/<id>`, parented to its pool). */
export function reservationResource(row: {
  id: string;
  tenant_id: string;
  pool_id: string;
  owner_identity_id: string;
  attributes?: Record<string, unknown>;
}): ResourceRef {
  return {
    type: 'compute-reservation',
    id: row.id,
    tenantId: row.tenant_id,
    ownerIdentityId: row.owner_identity_id,
    parent: { type: 'compute-pool', id: row.pool_id },
    attributes: row.attributes ?? {},
  };
}

/**
 * The tenant pre-check, then one IAM decision on the tenant itself (`compute-tenant/<id>`, with
 * `attributes` when given): the check of a method that reads across a tenant, not one reservation.
 */
export async function requireOnTenant(
  ctx: MethodContext,
  tenantId: string,
  action: IamAction,
  attributes?: Record<string, unknown>,
): Promise<void> {
  await preCheckTenant(ctx, tenantId);
  const resource: ResourceRef = { type: 'compute-tenant', id: tenantId, tenantId };
  if (attributes) resource.attributes = attributes;
  await ctx.deps.iam.require(ctx.principal, action, resource, { requestId: ctx.requestId });
}

/**
 * The tenant pre-check, then a reservation the tenant can see (never a draft, never another
 * tenant's), or NOT_FOUND.
 */
export async function findVisibleReservation(ctx: MethodContext, tenantId: string, reservationId: string) {
  await preCheckTenant(ctx, tenantId);
  const row = await findTenantReservation(ctx.deps.db, tenantId, reservationId);
  if (!row) {
    throw new ComputeError(
      'NOT_FOUND',
      `reservationId: tenant ${tenantId} has no reservation ${reservationId}`,
    );
  }
  return row;
}

/** How long an answer waits for a lifecycle call after its commit (see afterCommit). */
export const afterCommitWaitMs = 1_000;

/**
 * After a commit: a lifecycle call (a start, a wake-up) must never fail the call that already
 * changed the truth, nor hold its answer longer than afterCommitWaitMs.
 */
export async function afterCommit(ctx: MethodContext, what: string, fn: () => Promise<unknown> | undefined) {
  const call = Promise.resolve()
    .then(fn)
    .catch((err: unknown) =>
      ctx.log.warn({ err, what }, 'lifecycle call after commit failed; the sweeper catches up'),
    );
  // The answer waits for Temporal at most afterCommitWaitMs (a Temporal or a worker that is down
  // would hold it for 20 s and more); the call goes on in the background, and a lifecycle that
  // missed it is started by the orphan sweeper or re-reads the truth at its next timer.
  await waitAtMost(call, afterCommitWaitMs);
}

/** The calling principal as a reservation's audit row records it (its admission context). */
export function callerAudit(ctx: MethodContext, action: string): CallerAudit {
  return {
    actorIdentityId: ctx.principal.identityId,
    action,
    requestId: ctx.requestId,
    context: admissionContext(ctx.principal, ctx.requestId),
  };
}
