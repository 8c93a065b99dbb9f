import type { Transaction } from 'kysely';
import type { Database } from '../../core/database.ts';
import type { EventType } from '../../domain/event-types.ts';
import { newId } from '../../domain/ids.ts';

/**
 * Writes one event to the outbox in the caller's transaction (the one that made the change). Its
 * type is one of `eventTypes` (domain/event-types.ts).
 */
export async function insertOutboxEvent(
  trx: Transaction<Database>,
  event: { type: EventType; subject: string; tenantId: string | null; data: Record<string, unknown> },
): Promise<string> {
  const id = newId('evt');
  await trx
    .insertInto('outbox_events')
    .values({
      id,
      type: event.type,
      subject: event.subject,
      tenant_id: event.tenantId,
      data: JSON.stringify(event.data),
    })
    .execute();
  return id;
}
