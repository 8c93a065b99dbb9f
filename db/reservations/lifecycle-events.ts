import type { Transaction } from 'kysely';
import type { Database } from '../../core/database.ts';
import type { EventType } from '../../domain/event-types.ts';
import { insertAuditEvent } from '../events/audit.ts';
import { insertOutboxEvent } from '../events/outbox.ts';

type Trx = Transaction<Database>;

/**
 * The outbox event of a reservation's state change: subject `reservation/<id>`, with
 * `reservationId`, `state` and `poolId` first in the data and `data` after them.
 */
export function reservationStateEvent(
  reservation: { id: string; tenant_id: string; pool_id: string },
  type: EventType,
  state: string,
  data: Record<string, unknown> = {},
) {
  return {
    type,
    subject: `reservation/${reservation.id}`,
    tenantId: reservation.tenant_id,
    data: { reservationId: reservation.id, state, poolId: reservation.pool_id, ...data },
  };
}

/**
 * Writes a lifecycle event to the outbox and its audit row, in the caller's transaction (the one
 * that made the change). Subject `reservation/<id>`, with `reservationId`, `state` and `poolId` in
 * the data; the audit row names the lifecycle workflow as the actor.
 */
export async function recordReservationEvent(
  trx: Trx,
  reservation: { id: string; tenant_id: string; pool_id: string },
  type: EventType,
  state: string,
  data: Record<string, unknown> = {},
): Promise<void> {
  await insertOutboxEvent(trx, reservationStateEvent(reservation, type, state, data));
  await insertAuditEvent(trx, {
    tenantId: reservation.tenant_id,
    actorIdentityId: null,
    action: `compute:lifecycle:${type.replace(/^reservation\./, '')}`,
    resourceType: 'compute-reservation',
    resourceId: reservation.id,
    context: { actor: 'lifecycle-workflow', state, ...data },
  });
}
