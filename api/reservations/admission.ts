import { sql } from 'kysely';
import type { Reservation } from '../../core/database.ts';
import { withPlacementTransaction } from '../../db/allocations/placement.ts';
import { admissionContext, insertAuditEvent } from '../../db/events/audit.ts';
import { insertOutboxEvent } from '../../db/events/outbox.ts';
import { readAuthzResource } from '../../db/iam/authz.ts';
import { chargeQuota, precheckQuotaFree, quotaNeeds } from '../../db/reservations/quota.ts';
import {
  lockReservation,
  lockReservationForPlacement,
  placeLockedReservation,
} from '../../db/reservations/reservations.ts';
import { readReservationView } from '../../db/reservations/view.ts';
import { ComputeError, isComputeError } from '../../domain/errors.ts';
import type { HostResourceAmounts, NormalizedRequest } from '../../domain/reservation-request.ts';
import { normalizeRequest, requestHash } from '../../domain/reservation-request.ts';
import type { CreateReservationInput } from '../../domain/reservation-schema.ts';
import type { ReservationView } from '../../domain/reservation-view.ts';
import type { MethodContext } from '../method.ts';
import { afterCommit, preCheckTenant, reservationResource } from './access.ts';
import { type PoolForTenant, poolForTenant, writeDraft } from './draft.ts';

const action = 'compute:reservations:create';
const decidable = new Set(['draft', 'awaiting-confirmation']);

async function markRefused(ctx: MethodContext, row: Reservation, error: ComputeError) {
  const awaiting = await ctx.deps.db.transaction().execute(async (trx) => {
    const locked = await lockReservation(trx, row.id);
    if (!locked || !decidable.has(locked.state)) return false;
    if (error.code === 'CONFIRMATION_REQUIRED') {
      const expiresAt = Number(error.details?.expiresAt ?? 0);
      const confirmationId = String(error.details?.confirmationId ?? '');
      await trx
        .updateTable('reservations')
        .set({
          state: 'awaiting-confirmation',
          confirmation_id: confirmationId,
          confirmation_expires_at: new Date(expiresAt),
          conditions: JSON.stringify([
            {
              type: 'ConfirmationRequired',
              reason: confirmationId,
              message: String(expiresAt),
              since: Date.now(),
            },
          ]),
          version: sql<number>`version + 1`,
          updated_at: sql<Date>`compute_now()`,
        })
        .where('id', '=', row.id)
        .execute();
      if (locked.state !== 'awaiting-confirmation') {
        await insertOutboxEvent(trx, {
          type: 'reservation.awaiting-confirmation',
          subject: `reservation/${row.id}`,
          tenantId: row.tenant_id,
          data: {
            reservationId: row.id,
            state: 'awaiting-confirmation',
            poolId: row.pool_id,
            confirmationId,
            expiresAt,
          },
        });
      }
      return true;
    }
    await trx
      .updateTable('reservations')
      .set({
        state: 'denied',
        end_reason: error.message,
        version: sql<number>`version + 1`,
        updated_at: sql<Date>`compute_now()`,
      })
      .where('id', '=', row.id)
      .execute();
    await insertAuditEvent(trx, {
      tenantId: row.tenant_id,
      actorIdentityId: ctx.principal.identityId,
      action,
      resourceType: 'compute-reservation',
      resourceId: row.id,
      outcome: 'denied',
      requestId: ctx.requestId,
      context: { ...admissionContext(ctx.principal, ctx.requestId), reason: error.message },
    });
    return false;
  });
  // The lifecycle owns the confirmation's deadline: start it now rather than at the next sweep.
  if (awaiting) {
    await afterCommit(ctx, 'start', () =>
      ctx.deps.lifecycle?.start({
        id: row.id,
        tenantId: row.tenant_id,
        poolId: row.pool_id,
        state: 'awaiting-confirmation',
      }),
    );
  }
}

async function budgetCheck(ctx: MethodContext, row: Reservation, known?: PoolForTenant) {
  const pool = known ?? (await poolForTenant(ctx.deps.db, row.tenant_id, row.pool_id));
  const policy = pool.policy as { admission?: { budgetCheck?: string } };
  const checks =
    policy.admission?.budgetCheck === 'meter' ||
    ['stop-new', 'drain'].includes(pool.on_budget_exceeded ?? 'allow');
  if (!checks) return;
  const result = await ctx.deps.iam.billingCheck(row.tenant_id, `gpu.${pool.gpu_model}.hours`);
  if (!result.allowed) {
    throw new ComputeError(
      'SPEND_LIMIT_REACHED',
      `tenant ${row.tenant_id} has spent its budget${result.reason ? ` (${result.reason})` : ''}; retry with the same idempotency key once the budget resets or is raised`,
      { remaining: result.remaining ?? 0 },
    );
  }
}

/**
 * `reservations.create`, the admission sequence: tenant pre-check; transaction 1 (the draft and
 * its authz row, or the stored reservation for a repeated key); exactly one IAM decision outside
 * any transaction; the budget check; transaction 2 (placement, quota all or nothing, outbox event
 * and audit row with the admission context); then the lifecycle is started.
 */
export async function admitReservation(
  ctx: MethodContext,
  input: CreateReservationInput,
): Promise<ReservationView> {
  await preCheckTenant(ctx, input.tenantId);
  const { wait: _wait, idempotencyKey, ...rest } = input;
  const normalized: NormalizedRequest = normalizeRequest(rest);
  const hash = requestHash(input.tenantId, normalized);
  const draftInput = {
    tenantId: input.tenantId,
    principal: ctx.principal,
    idempotencyKey,
    request: normalized,
    hash,
  };
  const draft = await writeDraft(ctx.deps.db, draftInput, ctx.deps.caches);
  let row = draft.row;
  if (draft.kind === 'existing') {
    if (row.state === 'denied') {
      throw new ComputeError(
        'ACCESS_DENIED',
        `idempotencyKey: '${idempotencyKey}' was refused: ${row.end_reason ?? 'denied'}`,
        {
          reservationId: row.id,
        },
      );
    }
    if (row.state === 'awaiting-confirmation' && row.confirmation_expires_at) {
      const expired = await expireIfLate(ctx, row);
      if (expired) {
        throw new ComputeError(
          'INVALID_STATE',
          `reservation ${row.id} expired waiting for its confirmation; use a new key`,
          {
            reservationId: row.id,
          },
        );
      }
    }
    if (row.state === 'expired') {
      throw new ComputeError(
        'INVALID_STATE',
        `reservation ${row.id} expired waiting for its confirmation; use a new key`,
        {
          reservationId: row.id,
        },
      );
    }
    if (!decidable.has(row.state)) return (await readReservationView(ctx.deps.db, row.id))!;
  }

  const resource =
    draft.kind === 'created'
      ? reservationResource({ ...row, attributes: draft.attributes })
      : ((await readAuthzResource(ctx.deps.db, 'compute-reservation', row.id)) ?? reservationResource(row));
  try {
    await ctx.deps.iam.require(ctx.principal, action, resource, { requestId: ctx.requestId });
  } catch (error) {
    if (isComputeError(error) && (error.code === 'ACCESS_DENIED' || error.code === 'CONFIRMATION_REQUIRED')) {
      await markRefused(ctx, row, error);
      throw error.code === 'CONFIRMATION_REQUIRED'
        ? new ComputeError(error.code, error.message, { ...error.details, reservationId: row.id })
        : error;
    }
    throw error;
  }
  await budgetCheck(ctx, row, draft.kind === 'created' ? draft.pool : undefined);

  const context = admissionContext(ctx.principal, ctx.requestId);
  const outcome = await withPlacementTransaction(ctx.deps.db, async (trx) => {
    const locked = await lockReservationForPlacement(trx, row.id);
    if (!locked || !decidable.has(locked.state)) return null;
    const request = locked.request as unknown as NormalizedRequest;
    const share = (locked.host_share ?? {
      vcpu: 0,
      memoryGiB: 0,
      hugepages1Gi: 0,
    }) as unknown as HostResourceAmounts;
    const booked = { vcpu: 0, memoryGiB: 0, hugepages1Gi: 0, ...request.resources } as HostResourceAmounts;
    const needs = quotaNeeds(request, booked, share);
    // Fails fast, before placement work; chargeQuota below is the guarded truth.
    precheckQuotaFree(needs, locked.quota);
    const placed = await placeLockedReservation(trx, locked, locked.now.getTime(), {
      announcePending: true,
      ...(ctx.deps.caches ? { caches: ctx.deps.caches } : {}),
      extra: { admission_context: JSON.stringify(context), confirmation_id: null },
      audit: {
        tenantId: locked.tenant_id,
        actorIdentityId: ctx.principal.identityId,
        action,
        requestId: ctx.requestId,
        context: { ...context, poolId: locked.pool_id },
      },
    });
    // Quota last: its row locks are then held only until this commit.
    await chargeQuota(trx, {
      reservationId: row.id,
      tenantId: locked.tenant_id,
      poolId: locked.pool_id,
      needs,
    });
    return placed;
  });
  row = { ...row, state: outcome?.outcome === 'placed' ? 'placed' : 'pending' };
  if (outcome) {
    await afterCommit(ctx, 'start', () =>
      ctx.deps.lifecycle?.start({
        id: row.id,
        tenantId: row.tenant_id,
        poolId: row.pool_id,
        state: row.state,
      }),
    );
  }
  return (await readReservationView(ctx.deps.db, row.id))!;
}

/** A late retry of an awaiting-confirmation draft past its deadline expires it (true when it did). */
async function expireIfLate(ctx: MethodContext, row: Reservation): Promise<boolean> {
  return ctx.deps.db.transaction().execute(async (trx) => {
    const updated = await trx
      .updateTable('reservations')
      .set({
        state: 'expired',
        end_reason: 'confirmation-expired',
        version: sql<number>`version + 1`,
        updated_at: sql<Date>`compute_now()`,
      })
      .where('id', '=', row.id)
      .where('state', '=', 'awaiting-confirmation')
      .where(sql<boolean>`confirmation_expires_at <= compute_now()`)
      .returning('id')
      .executeTakeFirst();
    if (updated) {
      await insertOutboxEvent(trx, {
        type: 'reservation.expired',
        subject: `reservation/${row.id}`,
        tenantId: row.tenant_id,
        data: { reservationId: row.id, state: 'expired', poolId: row.pool_id },
      });
    }
    return Boolean(updated);
  });
}
