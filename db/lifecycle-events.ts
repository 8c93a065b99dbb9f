import type { Transaction } from 'kysely';
import { newId } from '../domain/ids.ts';
import type { Database } from './schema.ts';

type Trx = Transaction<Database>;

/**
 * Writes a lifecycle event to the outbox and its audit row, in the caller's transaction (the one
 * that made the change). Subject `reservation/<id>`, with `state` and `poolId` in the data.
 */
export async function recordReservationEvent(
  trx: Trx,
  reservation: { id: string; tenant_id: string; pool_id: string },
  type: string,
  state: string,
  data: Record<string, unknown> = {},
): Promise<void> {
  await trx
    .insertInto('outbox_events')
    .values({
      id: newId('evt'),
      type,
      subject: `reservation/${reservation.id}`,
      tenant_id: reservation.tenant_id,
      data: JSON.stringify({ reservationId: reservation.id, state, poolId: reservation.pool_id, ...data }),
    })
    .execute();
  await trx
    .insertInto('audit_events')
    .values({
      tenant_id: reservation.tenant_id,
      actor_identity_id: null,
      action: `compute:lifecycle:${type.replace(/^reservation\./, '')}`,
      resource_type: 'compute-reservation',
      resource_id: reservation.id,
      context: JSON.stringify({ actor: 'lifecycle-workflow', state, ...data }),
    })
    .execute();
}
