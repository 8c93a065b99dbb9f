import { sql } from 'kysely';
import type { Db } from '../../core/database.ts';
import { newId } from '../../domain/ids.ts';
import { eventually } from './eventually.ts';

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

/**
 * Waits until readers are shown these events: a reader shows an event only once every transaction
 * of this database older than its own has ended (outbox_horizon()).
 */
export async function untilReadable(db: Db, ids: readonly string[], timeoutMs = 60_000): Promise<void> {
  await eventually(async () => {
    const { rows } = await sql<{ readable: boolean }>`
      SELECT bool_and(xid < outbox_horizon()) AS readable
      FROM outbox_events WHERE id = ANY(${ids}::text[])`.execute(db);
    return rows[0]?.readable === true;
  }, timeoutMs);
}
