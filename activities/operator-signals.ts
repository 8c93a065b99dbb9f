import { Context } from '@temporalio/activity';
import type { Client } from '@temporalio/client';
import type { Db } from '../core/database.ts';
import type { IamDb } from '../core/iam-database.ts';
import type { IamPort } from '../core/iam-port.ts';
import type { Logger } from '../core/logger.ts';
import { insertAuditEvent } from '../db/events/audit.ts';
import { insertOutboxEvent } from '../db/events/outbox.ts';
import { findConfirmationState } from '../db/iam/confirmations.ts';
import { reservationStateEvent } from '../db/reservations/lifecycle-events.ts';
import { endReservationForCaller, lockReservation } from '../db/reservations/reservations.ts';
import { ComputeError } from '../domain/errors.ts';
import { asActivity } from './failure.ts';

export interface OperatorSignalActivityDeps {
  db: Db;
  log: Logger;
  /** Reads the workflow's history for the identity that sent a signal. */
  temporal: Client;
  /** Decides the IAM confirmation a `confirm` signal answers (absent: confirm is UNSUPPORTED). */
  iam?: Pick<IamPort, 'admin'>;
}

/** A signal an operator sends to a reservation's lifecycle from the Temporal UI or CLI. */
export type ReservationOperatorSignal = 'cancel' | 'release' | 'confirm';

/** The audit rows' actor for a Temporal identity (`temporal-cli:ada@host`, a client's `identity`). */
export const temporalActor = (identity: string) => `temporal:${identity}`;

/**
 * The request id of the `ordinal`-th signal `name` of one workflow run: the idempotency key of its
 * audit row, so a retried activity applies a signal once.
 */
export const signalRequestId = (runId: string, name: string, ordinal: number) =>
  `signal:${runId}:${name}:${ordinal}`;

/**
 * Operator signals, shared by every workflow that takes one. A workflow counts the signals of each
 * name it received in its run (`ordinal`, from 1); since signals are delivered in history order,
 * the `ordinal`-th WorkflowExecutionSignaled event of that name in the run is this one, and its
 * `identity` is who sent it (the Temporal CLI's `--identity`, a client's `identity` option).
 */
export function createOperatorSignalActivities({ db, log, temporal, iam }: OperatorSignalActivityDeps) {
  /** The calling activity's workflow run, and the identity of the `ordinal`-th signal `name` in it. */
  async function currentSignal(name: string, ordinal: number) {
    const execution = Context.current().info.workflowExecution;
    if (!execution) throw new Error('an operator signal activity runs only for a workflow');
    const { workflowId, runId } = execution;
    const history = await temporal.workflow.getHandle(workflowId, runId).fetchHistory();
    const sent = (history.events ?? []).filter(
      (e) => e.workflowExecutionSignaledEventAttributes?.signalName === name,
    );
    const identity = sent[ordinal - 1]?.workflowExecutionSignaledEventAttributes?.identity || 'unknown';
    return { workflowId, runId, identity, requestId: signalRequestId(runId, name, ordinal) };
  }

  async function alreadyApplied(reservationId: string, requestId: string): Promise<boolean> {
    const row = await db
      .selectFrom('audit_events')
      .select('id')
      .where('resource_type', '=', 'compute-reservation')
      .where('resource_id', '=', reservationId)
      .where('request_id', '=', requestId)
      .executeTakeFirst();
    return row !== undefined;
  }

  return {
    /**
     * The Temporal identity that sent the `ordinal`-th signal `signal` to the calling activity's
     * workflow run: for any workflow that names it in an audit row (a preemption's or a
     * BookingRepair's `cancel`).
     */
    async identifyOperatorSignal(input: { signal: string; ordinal: number }): Promise<{ identity: string }> {
      const { identity } = await currentSignal(input.signal, input.ordinal);
      return { identity };
    },

    /**
     * Applies an operator's `cancel`, `release` or `confirm` signal exactly as the API applies the
     * method of that name: `cancel`/`release` end the reservation in one transaction with its
     * outbox event and an audit row naming the Temporal identity (INVALID_STATE when a cancel
     * comes after the start); `confirm` records the decision in IAM for the person the
     * confirmation waits for, then the audit row (INVALID_STATE when the reservation no longer
     * awaits it, UNSUPPORTED when this IAM is administered elsewhere). Idempotent on the signal
     * (its audit row's request id): a retry after the commit changes nothing.
     */
    async applyReservationSignal(input: {
      reservationId: string;
      signal: ReservationOperatorSignal;
      ordinal: number;
      decision?: 'approved' | 'denied';
      reason?: string;
    }): Promise<{ applied: boolean; state: string | null; poolId: string | null; freed: boolean }> {
      return asActivity(async () => {
        const sent = await currentSignal(input.signal, input.ordinal);
        if (await alreadyApplied(input.reservationId, sent.requestId)) {
          return { applied: false, state: null, poolId: null, freed: false };
        }
        const context = {
          via: 'temporal-signal',
          signal: input.signal,
          temporalIdentity: sent.identity,
          workflowId: sent.workflowId,
          runId: sent.runId,
          requestId: sent.requestId,
          ...(input.reason ? { reason: input.reason } : {}),
        };
        if (input.signal === 'confirm') {
          const decision = input.decision!;
          await decideConfirmationFor(input.reservationId, decision);
          const row = await db
            .selectFrom('reservations')
            .select(['tenant_id', 'pool_id', 'state', 'confirmation_id'])
            .where('id', '=', input.reservationId)
            .executeTakeFirstOrThrow();
          await insertAuditEvent(db, {
            tenantId: row.tenant_id,
            actorIdentityId: temporalActor(sent.identity),
            action: 'compute:confirmations:decide',
            resourceType: 'compute-reservation',
            resourceId: input.reservationId,
            requestId: sent.requestId,
            context: { ...context, decision, confirmationId: row.confirmation_id },
          });
          log.info(
            { reservationId: input.reservationId, decision, identity: sent.identity },
            'confirm signal',
          );
          return { applied: true, state: row.state, poolId: row.pool_id, freed: false };
        }
        const result = await db.transaction().execute(async (trx) => {
          const row = await lockReservation(trx, input.reservationId);
          if (!row) throw new ComputeError('NOT_FOUND', `reservation ${input.reservationId} does not exist`);
          return endReservationForCaller(trx, {
            reservationId: row.id,
            tenantId: row.tenant_id,
            kind: input.signal === 'cancel' ? 'cancel' : 'release',
            audit: {
              actorIdentityId: temporalActor(sent.identity),
              action: 'compute:reservations:release',
              requestId: sent.requestId,
              context,
            },
          });
        });
        log.info(
          {
            reservationId: input.reservationId,
            signal: input.signal,
            identity: sent.identity,
            state: result.state,
          },
          'operator signal applied',
        );
        return { applied: result.changed, state: result.state, poolId: result.poolId, freed: result.freed };
      });
    },

    /**
     * A refused signal cannot answer its sender: the refusal is published as
     * `reservation.signal-refused` (the signal, the code, the reason and the Temporal identity) with
     * its audit row (`outcome: denied`), in one transaction. Idempotent on the signal.
     */
    async refuseReservationSignal(input: {
      reservationId: string;
      signal: string;
      ordinal: number;
      code: string;
      message: string;
    }): Promise<void> {
      const sent = await currentSignal(input.signal, input.ordinal);
      if (await alreadyApplied(input.reservationId, sent.requestId)) return;
      await db.transaction().execute(async (trx) => {
        const row = await trx
          .selectFrom('reservations')
          .select(['id', 'tenant_id', 'pool_id', 'state'])
          .where('id', '=', input.reservationId)
          .executeTakeFirst();
        const reservation = row ?? { id: input.reservationId, tenant_id: '', pool_id: '', state: 'missing' };
        const data = {
          signal: input.signal,
          code: input.code,
          reason: input.message,
          temporalIdentity: sent.identity,
          workflowId: sent.workflowId,
        };
        await insertOutboxEvent(trx, {
          ...reservationStateEvent(reservation, 'reservation.signal-refused', reservation.state, data),
          tenantId: row?.tenant_id ?? null,
        });
        await insertAuditEvent(trx, {
          tenantId: row?.tenant_id ?? null,
          actorIdentityId: temporalActor(sent.identity),
          action: `compute:signal:${input.signal}`,
          resourceType: 'compute-reservation',
          resourceId: input.reservationId,
          outcome: 'denied',
          requestId: sent.requestId,
          context: { via: 'temporal-signal', ...data, runId: sent.runId },
        });
      });
      log.warn(
        {
          reservationId: input.reservationId,
          signal: input.signal,
          code: input.code,
          identity: sent.identity,
        },
        `refused the ${input.signal} signal: ${input.message}`,
      );
    },
  };

  /** Decides the reservation's pending confirmation for the person it waits for. */
  async function decideConfirmationFor(reservationId: string, decision: 'approved' | 'denied') {
    const admin = iam?.admin;
    if (!admin) {
      throw new ComputeError(
        'UNSUPPORTED',
        "this worker's IAM is administered outside compute: decide the confirmation in that IAM",
      );
    }
    const row = await db
      .selectFrom('reservations')
      .select(['state', 'confirmation_id'])
      .where('id', '=', reservationId)
      .executeTakeFirst();
    if (!row || row.state !== 'awaiting-confirmation' || !row.confirmation_id) {
      throw new ComputeError(
        'INVALID_STATE',
        `the reservation is not awaiting confirmation; it is ${row?.state ?? 'missing'}`,
        { state: row?.state ?? null },
      );
    }
    // An IAM administered here (admin present) is the embedded one, in this same database.
    const confirmation = await findConfirmationState(db as unknown as IamDb, row.confirmation_id);
    if (!confirmation) {
      throw new ComputeError('NOT_FOUND', `confirmation ${row.confirmation_id} does not exist`);
    }
    if (confirmation.state === decision) return;
    await admin.decideConfirmation({
      confirmationId: row.confirmation_id,
      personIdentityId: confirmation.personIdentityId,
      decision,
    });
  }
}

export type OperatorSignalActivities = ReturnType<typeof createOperatorSignalActivities>;
