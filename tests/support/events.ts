import type { Db } from '../../core/database.ts';
import { newId } from '../../domain/ids.ts';

/**
 * Writes one outbox event the way a committed state change does (outside any other transaction
 * when `db` is the pool); answers its id.
 */
export async function insertOutboxEvent(
  db: Db,
  event: { type: string; subject: string; tenantId: string | null; data?: unknown; id?: string },
): Promise<string> {
  const id = event.id ?? newId('evt');
  await db
    .insertInto('outbox_events')
    .values({
      id,
      type: event.type,
      subject: event.subject,
      tenant_id: event.tenantId,
      data: JSON.stringify(event.data ?? {}),
    })
    .execute();
  return id;
}
