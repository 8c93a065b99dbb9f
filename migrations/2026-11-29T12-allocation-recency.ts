import { type Kysely, sql } from 'kysely';

/**
 * The placer's candidate sample starts from the newest live allocations (their nodes are the
 * partly used ones best fit prefers); this index reads them newest first without a sort.
 */
export async function up(db: Kysely<any>): Promise<void> {
  await sql`CREATE INDEX allocations_live_created_idx ON allocations (created_at DESC)
    WHERE state NOT IN ('released', 'failed')`.execute(db);
}

export async function down(db: Kysely<any>): Promise<void> {
  await sql`DROP INDEX allocations_live_created_idx`.execute(db);
}
