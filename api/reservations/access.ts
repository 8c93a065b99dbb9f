import { BackgroundCalls } from '../../core/background-calls.ts';
import { waitAtMost } from '../../core/bounded-wait.ts';
import type { ReservationLifecycle } from '../../core/deps.ts';
import type { ResourceRef } from '../../core/iam-port.ts';
import type { Logger } from '../../core/logger.ts';
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

/**
 * How a process starts the lifecycles of the reservations its creates committed: at most 32 starts
 * in flight to Temporal and 10,000 waiting, per lifecycle port (one per process). A start beyond
 * them is left to the orphan sweeper, which starts every live reservation without its workflow.
 */
const lifecycleStarts = new WeakMap<ReservationLifecycle, BackgroundCalls>();
const startsConcurrency = 32;
const startsMaxWaiting = 10_000;

function startsOf(lifecycle: ReservationLifecycle, log: Logger): BackgroundCalls {
  let starts = lifecycleStarts.get(lifecycle);
  if (!starts) {
    starts = new BackgroundCalls({
      concurrency: startsConcurrency,
      maxWaiting: startsMaxWaiting,
      onDropped: (reservationId, dropped) => {
        if (dropped === 1)
          log.warn(
            { reservationId, waiting: startsMaxWaiting },
            'lifecycle starts are behind Temporal; the orphan sweeper starts the ones left out',
          );
      },
      onError: (reservationId, err) =>
        log.warn({ err, reservationId }, 'lifecycle start after commit failed; the sweeper catches up'),
    });
    lifecycleStarts.set(lifecycle, starts);
  }
  return starts;
}

/**
 * After a create's commit: its reservation's lifecycle is started in the background, and the
 * answer does not wait for it (DESIGN.md principle 3: admission's answer must not wait on
 * Temporal's throughput, which is lower than the placement rate). A reservation whose start is
 * still on its way, or was left out, has no workflow for a moment: every call that needs one
 * starts it first (`signal`'s updates), and the orphan sweeper starts any left behind.
 */
export function startLifecycleSoon(
  ctx: MethodContext,
  reservation: { id: string; tenantId: string; poolId: string; state: string },
): void {
  const lifecycle = ctx.deps.lifecycle;
  if (!lifecycle) return;
  startsOf(lifecycle, ctx.deps.log).schedule(reservation.id, () => lifecycle.start(reservation));
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
