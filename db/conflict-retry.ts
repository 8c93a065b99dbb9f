import type { Transaction } from 'kysely';
import type { Database, Db } from '../core/database.ts';

/**
 * PostgreSQL broke a deadlock (`40P01`) or a serialization conflict (`40001`): the transaction was
 * rolled back whole, nothing of it stayed, and running it again is safe.
 */
export function isTransientConflict(error: unknown): boolean {
  const code = (error as { code?: unknown } | null)?.code;
  return code === '40P01' || code === '40001';
}

/**
 * A statement's guarded write found nothing to change and compute_abort() failed it (SQLSTATE
 * `BC002`, migration 2026-12-01T01; the booking guards' own refusals are `BC001`): the statement was undone whole, nothing of it stayed.
 */
export function isGuardAbort(error: unknown): boolean {
  return (error as { code?: unknown } | null)?.code === 'BC002';
}

/**
 * Runs `fn` in a transaction, again (up to `attempts` times in all, after a short random pause that
 * grows with each attempt) when PostgreSQL rolled it back for a deadlock or a serialization
 * conflict (`isTransientConflict`). Any other error, or the last attempt's conflict, is thrown as
 * is. `fn` must be safe to run again: it may run up to `attempts` times, only the last commits.
 */
export async function transactionRetryingConflicts<T>(
  db: Db,
  fn: (trx: Transaction<Database>) => Promise<T>,
  attempts = 5,
): Promise<T> {
  for (let attempt = 1; ; attempt++) {
    try {
      return await db.transaction().execute(fn);
    } catch (error) {
      if (!isTransientConflict(error) || attempt >= attempts) throw error;
      // wall time: a back-off pause so the two sides of a conflict do not collide again at once
      await new Promise((resolve) => setTimeout(resolve, 5 + Math.random() * 20 * attempt));
    }
  }
}
