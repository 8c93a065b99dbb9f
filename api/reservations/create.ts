import type { Reservation } from '../../core/database.ts';
import { withPlacementTransaction } from '../../db/allocations/placement.ts';
import { rethrowRecordingDemand } from '../../db/holds/demand.ts';
import { readAuthzResource } from '../../db/iam/authz.ts';
import { awaitConfirmation, denyDraft, expireLateConfirmation } from '../../db/reservations/admission.ts';
import { type PoolForTenant, poolForTenant, writeDraft } from '../../db/reservations/draft.ts';
import { placeDraftAtOnce } from '../../db/reservations/place-draft-at-once.ts';
import { placeDraft } from '../../db/reservations/placement.ts';
import { queueDraftSoon } from '../../db/reservations/queue-drafts.ts';
import { type SettledWatch, watchSettled } from '../../db/reservations/settled-watch.ts';
import { readReservationView, readReservationViewSoon } from '../../db/reservations/view.ts';
import { ComputeError, isComputeError } from '../../domain/errors.ts';
import { poolPlacer, readPoolPolicy } from '../../domain/pool-policy.ts';
import { normalizeRequest, requestHash } from '../../domain/reservation-request.ts';
import { createReservationInput } from '../../domain/reservation-schema.ts';
import { isUndecided } from '../../domain/reservation-states.ts';
import { type ReservationView, reservationViewSchema } from '../../domain/reservation-view.ts';
import { defineMethod, type MethodContext } from '../method.ts';
import {
  afterCommit,
  callerAudit,
  preCheckTenant,
  reservationResource,
  startLifecycleSoon,
} from './access.ts';

const action = 'compute:reservations:create';

/** The longest a `wait` holds an answer. */
export const maxWaitMs = 30_000;

/**
 * Re-reads the reservation while its operation is `running`, until `timeoutMs` (capped at 30 s)
 * passes or the caller goes away; answers the last read either way. It re-reads as soon as a
 * pool-lease batch that decided it commits (its settle notification); besides, it re-reads backing
 * off from 50 ms to 1 s, or from 1 s to 5 s while notifications are heard (a safety net only).
 * `watch`, when the caller began it before the reservation was queued, means no notification can
 * have been missed: the first read waits for one instead of re-reading at once (and `view` may then
 * be omitted: nothing is read until the batch answers). The watch is closed either way.
 */
export async function waitForOperation(
  ctx: MethodContext,
  reservationId: string,
  timeoutMs: number,
  known: { view?: ReservationView; watch?: SettledWatch },
): Promise<ReservationView | null> {
  if (known.view && known.view.operation.state !== 'running') {
    known.watch?.close();
    return known.view;
  }
  // wall time: how long the caller's HTTP request may wait, not a decision about the reservation
  const deadline = Date.now() + Math.min(timeoutMs, maxWaitMs);
  let delay = 50;
  let current = known.view ?? null;
  const settled = known.watch ?? watchSettled(ctx.deps.db, reservationId, ctx.deps.log);
  try {
    // A watch begun here began after the caller's read: a batch that committed since is not missed.
    if (!known.watch) current = (await readReservationView(ctx.deps.db, reservationId)) ?? current;
    const running = () =>
      (current?.operation.state ?? 'running') === 'running' &&
      // wall time: the same bounded wait
      Date.now() < deadline &&
      !ctx.signal.aborted;
    while (running()) {
      // While notifications are heard, a re-read without one is only a safety net (each re-read is
      // a view read the batch's commit would have announced anyway).
      const pause = settled.listening ? Math.max(delay, 1_000) : delay;
      // wall time: the pause before the next read, within the same bounded wait
      await settled.next(Math.min(pause, Math.max(0, deadline - Date.now())), ctx.signal);
      delay = Math.min(delay * 2, settled.listening ? 5_000 : 1_000);
      // A batch's commit wakes its creates together: their reads go as one statement.
      current = (await readReservationViewSoon(ctx.deps.db, reservationId)) ?? current;
    }
    if (!current) current = (await readReservationView(ctx.deps.db, reservationId)) ?? null;
  } finally {
    settled.close();
  }
  return current;
}

/**
 * IAM refused the draft: a confirmation hold makes it `awaiting-confirmation` and starts its
 * lifecycle (which owns the confirmation's deadline) now rather than at the next sweep; a denial
 * makes it `denied`. Answers the error to throw.
 */
async function recordRefusal(
  ctx: MethodContext,
  row: Reservation,
  error: ComputeError,
): Promise<ComputeError> {
  if (error.code !== 'CONFIRMATION_REQUIRED') {
    const audit = callerAudit(ctx, action);
    await ctx.deps.db
      .transaction()
      .execute((trx) => denyDraft(trx, { reservationId: row.id, reason: error.message, audit }));
    return error;
  }
  const hold = {
    reservationId: row.id,
    confirmationId: String(error.details?.confirmationId ?? ''),
    expiresAt: Number(error.details?.expiresAt ?? 0),
  };
  const awaiting = await ctx.deps.db.transaction().execute((trx) => awaitConfirmation(trx, hold));
  if (awaiting) {
    startLifecycleSoon(ctx, {
      id: row.id,
      tenantId: row.tenant_id,
      poolId: row.pool_id,
      state: 'awaiting-confirmation',
    });
  }
  return new ComputeError(error.code, error.message, { ...error.details, reservationId: row.id });
}

/** The budget check after the allow: SPEND_LIMIT_REACHED when the pool's policy stops new work. */
async function budgetCheck(ctx: MethodContext, row: Reservation, pool: PoolForTenant) {
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
 * A repeated key answers its stored reservation: ACCESS_DENIED when it was refused, INVALID_STATE
 * when it expired waiting for its confirmation (expiring it now when its deadline passed), else the
 * reservation as it is once admission has decided it (null while it still awaits the decision).
 */
async function answerRepeatedKey(
  ctx: MethodContext,
  row: Reservation,
  idempotencyKey: string,
): Promise<ReservationView | null> {
  if (row.state === 'denied') {
    throw new ComputeError(
      'ACCESS_DENIED',
      `idempotencyKey: '${idempotencyKey}' was refused: ${row.end_reason ?? 'denied'}`,
      { reservationId: row.id },
    );
  }
  const expired =
    row.state === 'expired' ||
    (row.state === 'awaiting-confirmation' &&
      row.confirmation_expires_at !== null &&
      (await ctx.deps.db.transaction().execute((trx) => expireLateConfirmation(trx, row.id))));
  if (expired) {
    throw new ComputeError(
      'INVALID_STATE',
      `reservation ${row.id} expired waiting for its confirmation; use a new key`,
      { reservationId: row.id },
    );
  }
  return isUndecided(row.state) ? null : (await readReservationView(ctx.deps.db, row.id))!;
}

export const create = defineMethod({
  summary:
    'Reserve devices of a pool for a time window, idempotently by key: a draft, one IAM decision, then quota and placement (placed, or pending with an Unschedulable condition; in a pool-lease pool, pending with a Queued condition until the pool placer batch, which `wait` waits for).',
  action,
  input: createReservationInput,
  output: reservationViewSchema,
  /**
   * The admission sequence: tenant pre-check; transaction 1 (the draft and its authz row, or the
   * stored reservation for a repeated key); exactly one IAM decision outside any transaction; the
   * budget check; transaction 2 (placement, quota all or nothing, outbox event and audit row with
   * the admission context: for a new draft first as single statements, placeDraftAtOnce and
   * queueDraftSoon, then placeDraft for whatever they did not decide); then the lifecycle is
   * started.
   */
  handler: async (ctx, input) => {
    await preCheckTenant(ctx, input.tenantId);
    const { wait, idempotencyKey, ...rest } = input;
    const request = normalizeRequest(rest);
    const draft = await writeDraft(
      ctx.deps.db,
      {
        tenantId: input.tenantId,
        principal: ctx.principal,
        idempotencyKey,
        request,
        hash: requestHash(input.tenantId, request),
      },
      ctx.deps.caches,
    );
    const row = draft.row;
    const answer = async (view: ReservationView) =>
      wait ? ((await waitForOperation(ctx, view.id, wait.timeoutMs, { view })) ?? view) : view;
    if (draft.kind === 'existing') {
      const decided = await answerRepeatedKey(ctx, row, idempotencyKey);
      if (decided) return answer(decided);
    }

    const resource =
      draft.kind === 'created'
        ? reservationResource({ ...row, attributes: draft.attributes })
        : ((await readAuthzResource(ctx.deps.db, 'compute-reservation', row.id)) ?? reservationResource(row));
    try {
      // Bound to the stored request: a delegated approval admits this very request, once.
      await ctx.deps.iam.require(ctx.principal, action, resource, {
        requestId: ctx.requestId,
        requestHash: row.request_hash,
      });
    } catch (error) {
      if (
        isComputeError(error) &&
        (error.code === 'ACCESS_DENIED' || error.code === 'CONFIRMATION_REQUIRED')
      ) {
        throw await recordRefusal(ctx, row, error);
      }
      throw error;
    }
    const pool =
      draft.kind === 'created' ? draft.pool : await poolForTenant(ctx.deps.db, row.tenant_id, row.pool_id);
    await budgetCheck(ctx, row, pool);

    const placer = poolPlacer(readPoolPolicy(pool.policy));
    // Waiting on a pool-lease batch: watched from before the request is queued, so its batch's
    // settle notification cannot be missed and no read is needed until it comes.
    const watch =
      wait && placer === 'pool-lease' ? watchSettled(ctx.deps.db, row.id, ctx.deps.log) : undefined;
    const audit = callerAudit(ctx, action);
    const decide = async () => {
      // The common case first, in single statements; whatever they do not decide, placeDraft does.
      if (draft.kind === 'created') {
        const atOnce =
          placer === 'pool-lease'
            ? await queueDraftSoon(ctx.deps.db, {
                row,
                now: draft.now,
                audit,
                onNotifyError: (err) =>
                  ctx.deps.log.warn(
                    { err, poolId: row.pool_id },
                    'the pool placer was not notified; its poll will find the request',
                  ),
              })
            : ctx.deps.caches
              ? await placeDraftAtOnce(ctx.deps.db, { row, now: draft.now, audit, caches: ctx.deps.caches })
              : null;
        if (atOnce) return atOnce;
      }
      return withPlacementTransaction(ctx.deps.db, (trx) =>
        placeDraft(trx, {
          reservationId: row.id,
          audit,
          ...(ctx.deps.caches ? { caches: ctx.deps.caches } : {}),
          placer,
        }),
      );
    };
    const outcome = await decide().catch((error: unknown) => {
      watch?.close();
      return rethrowRecordingDemand(ctx.deps.db, row, error);
    });
    if (outcome) {
      // A queued one's lifecycle waits: the pool placer's batch places it and wakes it.
      const state = outcome.outcome === 'placed' ? 'placed' : 'pending';
      startLifecycleSoon(ctx, { id: row.id, tenantId: row.tenant_id, poolId: row.pool_id, state });
      const preemption = outcome.outcome === 'placed' ? outcome.preemption : undefined;
      if (preemption) await afterCommit(ctx, 'preempt', () => ctx.deps.lifecycle?.preempt?.(preemption));
    }
    // Queued and watched: the first read is the batch's answer (or the wait's end).
    const queuedWait = outcome?.outcome === 'queued' && watch && wait;
    if (watch && !queuedWait) watch.close();
    // Placed in one statement: its view came back with it (no read after the commit).
    const written = outcome?.outcome === 'placed' ? outcome.view : undefined;
    const view = queuedWait
      ? await waitForOperation(ctx, row.id, wait.timeoutMs, { watch })
      : (written ?? (await readReservationView(ctx.deps.db, row.id)));
    if (!view) {
      // The draft cleanup removed this refused draft (past its retention) while it was decided.
      throw new ComputeError(
        'CONFLICT',
        `reservation ${row.id} was removed while it was decided; retry with the same idempotency key`,
        { reservationId: row.id, retryAfterSeconds: 1 },
      );
    }
    return queuedWait ? view : answer(view);
  },
});
