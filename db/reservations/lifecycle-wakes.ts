import { sql, type Transaction } from 'kysely';
import type { Database, Db } from '../../core/database.ts';

type Trx = Transaction<Database>;

/** Records, in the release's own transaction, that the reservation's lifecycle must be woken. */
export async function recordLifecycleWake(trx: Trx, reservationId: string, reason: string): Promise<void> {
  await trx
    .insertInto('lifecycle_wakes')
    .values({ reservation_id: reservationId, reason })
    .onConflict((oc) =>
      oc.column('reservation_id').doUpdateSet({ reason, created_at: sql<Date>`compute_now()` }),
    )
    .execute();
}

/** The lifecycle was woken: its wake is no longer owed. */
export async function clearLifecycleWake(db: Db, reservationId: string): Promise<void> {
  await db.deleteFrom('lifecycle_wakes').where('reservation_id', '=', reservationId).execute();
}

/** The oldest `limit` wakes still owed `graceMs` after they were recorded (the sweeper's to send). */
export async function findOwedLifecycleWakes(db: Db, input: { graceMs: number; limit: number }) {
  return db
    .selectFrom('lifecycle_wakes')
    .where(sql<boolean>`created_at < compute_now() - make_interval(secs => ${input.graceMs / 1000})`)
    .select(['reservation_id', 'reason'])
    .orderBy('created_at')
    .limit(input.limit)
    .execute();
}
