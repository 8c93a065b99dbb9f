import { sql } from 'kysely';
import type { Db } from '../core/database.ts';

/** The control plane's one clock, as the database reads it. */
export async function readComputeNow(db: Db): Promise<Date> {
  const { rows } = await sql<{ now: Date }>`SELECT compute_now() AS now`.execute(db);
  return rows[0]!.now;
}

/** Moves the clock by `ms` (tests only): every later compute_now() reads that much later. */
export async function advanceComputeClock(db: Db, ms: number): Promise<void> {
  await sql`UPDATE compute_clock SET offset_by = offset_by + make_interval(secs => ${ms / 1000})`.execute(db);
}

/** Freezes the clock at `at`, or unfreezes it with null (tests only). */
export async function freezeComputeClock(db: Db, at: Date | null): Promise<void> {
  await sql`UPDATE compute_clock SET frozen_at = ${at}`.execute(db);
}
