import { sql, type Transaction } from 'kysely';
import type { Database } from '../../core/database.ts';
import { terminalEventTypes } from '../../domain/event-types.ts';
import { isUndecided } from '../../domain/reservation-states.ts';
import { insertAuditEvent } from '../events/audit.ts';
import { insertOutboxEvent } from '../events/outbox.ts';
import { reservationStateEvent } from './lifecycle-events.ts';
import { type CallerAudit, lockReservation } from './reservations.ts';

type Trx = Transaction<Database>;

/**
 * Admission's transactions around its one IAM decision (the draft is db/reservations/draft.ts, the
 * placement db/reservations/placement.ts): the refusals and the late retry of an expired one.
 */

/**
 * IAM asked for a confirmation: the draft becomes `awaiting-confirmation` with the confirmation's
 * id and deadline and a `ConfirmationRequired` condition (since compute_now()), and
 * `reservation.awaiting-confirmation` is written the first time. Answers true when it waits for
 * the confirmation now, false when it no longer awaits a decision (nothing changes).
 * Idempotent: a repeated refusal only refreshes the confirmation.
 */
export async function awaitConfirmation(
  trx: Trx,
  input: { reservationId: string; confirmationId: string; expiresAt: number },
): Promise<boolean> {
  const locked = await lockReservation(trx, input.reservationId);
  if (!locked || !isUndecided(locked.state)) return false;
  await trx
    .updateTable('reservations')
    .set({
      state: 'awaiting-confirmation',
      confirmation_id: input.confirmationId,
      confirmation_expires_at: new Date(input.expiresAt),
      conditions: sql<string>`jsonb_build_array(jsonb_build_object(
        'type', 'ConfirmationRequired', 'reason', ${input.confirmationId}::text,
        'message', ${String(input.expiresAt)}::text,
        'since', floor(extract(epoch FROM compute_now()) * 1000)::bigint))`,
      version: sql<number>`version + 1`,
      updated_at: sql<Date>`compute_now()`,
    })
    .where('id', '=', locked.id)
    .execute();
  if (locked.state !== 'awaiting-confirmation') {
    await insertOutboxEvent(
      trx,
      reservationStateEvent(locked, 'reservation.awaiting-confirmation', 'awaiting-confirmation', {
        confirmationId: input.confirmationId,
        expiresAt: input.expiresAt,
      }),
    );
  }
  return true;
}

/**
 * IAM denied the draft: it becomes `denied` (terminal, `end_reason` = the refusal's message) with
 * its terminal event `reservation.denied` (data: `reason`) and a `denied` audit row carrying the
 * admission context, in the caller's transaction. A reservation no longer awaiting a decision
 * changes nothing, so a repeated refusal writes nothing twice.
 */
export async function denyDraft(
  trx: Trx,
  input: {
    reservationId: string;
    reason: string;
    audit: CallerAudit;
  },
): Promise<void> {
  const locked = await lockReservation(trx, input.reservationId);
  if (!locked || !isUndecided(locked.state)) return;
  await trx
    .updateTable('reservations')
    .set({
      state: 'denied',
      end_reason: input.reason,
      version: sql<number>`version + 1`,
      updated_at: sql<Date>`compute_now()`,
    })
    .where('id', '=', locked.id)
    .execute();
  await insertOutboxEvent(
    trx,
    reservationStateEvent(locked, terminalEventTypes.denied, 'denied', { reason: input.reason }),
  );
  await insertAuditEvent(trx, {
    tenantId: locked.tenant_id,
    actorIdentityId: input.audit.actorIdentityId,
    action: input.audit.action,
    resourceType: 'compute-reservation',
    resourceId: locked.id,
    outcome: 'denied',
    requestId: input.audit.requestId,
    context: { ...input.audit.context, reason: input.reason },
  });
}

/**
 * A late retry of an `awaiting-confirmation` reservation past its deadline (compute_now()) expires
 * it, with `reservation.expired`; answers whether it did. Idempotent: anything else changes nothing.
 */
export async function expireLateConfirmation(trx: Trx, reservationId: string): Promise<boolean> {
  const updated = await trx
    .updateTable('reservations')
    .set({
      state: 'expired',
      end_reason: 'confirmation-expired',
      version: sql<number>`version + 1`,
      updated_at: sql<Date>`compute_now()`,
    })
    .where('id', '=', reservationId)
    .where('state', '=', 'awaiting-confirmation')
    .where(sql<boolean>`confirmation_expires_at <= compute_now()`)
    .returning(['id', 'tenant_id', 'pool_id'])
    .executeTakeFirst();
  if (updated) {
    await insertOutboxEvent(trx, reservationStateEvent(updated, 'reservation.expired', 'expired'));
  }
  return Boolean(updated);
}
