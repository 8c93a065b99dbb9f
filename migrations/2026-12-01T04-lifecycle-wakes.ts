import { type Kysely, sql } from 'kysely';

/**
 * The wakes a caller's release or cancel owes its reservation's lifecycle, written in the same
 * transaction as the release: the API removes the row once the workflow has been told, and the
 * sweeper tells the workflows of rows left behind (the API process died after its commit, or
 * Temporal did not answer), so no ended reservation's lifecycle sleeps on until its next timer.
 */
export async function up(db: Kysely<any>): Promise<void> {
  await sql`
    CREATE TABLE lifecycle_wakes (
      reservation_id text PRIMARY KEY REFERENCES reservations(id) ON DELETE CASCADE,
      reason text NOT NULL,
      created_at timestamptz NOT NULL DEFAULT compute_now()
    );
    CREATE INDEX lifecycle_wakes_created_idx ON lifecycle_wakes (created_at);
  `.execute(db);
}

export async function down(db: Kysely<any>): Promise<void> {
  await sql`DROP TABLE lifecycle_wakes`.execute(db);
}
