import { type Kysely, sql } from 'kysely';

/**
 * The pool-lease placer: named leases with a fencing epoch (`pool:<id>` today; the glossary's
 * shard leases share the shape), and the index its batches read the queue through (pending
 * reservations with a `Queued` condition, oldest first per pool).
 */
export async function up(db: Kysely<any>): Promise<void> {
  await sql`
    CREATE TABLE leases (
      name text PRIMARY KEY,
      holder text NOT NULL,
      epoch bigint NOT NULL CHECK (epoch >= 1),
      acquired_at timestamptz NOT NULL DEFAULT compute_now(),
      renewed_at timestamptz NOT NULL DEFAULT compute_now(),
      expires_at timestamptz NOT NULL
    );
    CREATE INDEX reservations_queued_idx ON reservations (pool_id, created_at)
      WHERE state = 'pending' AND conditions @> '[{"type":"Queued"}]';
  `.execute(db);
}

export async function down(db: Kysely<any>): Promise<void> {
  await sql`
    DROP INDEX reservations_queued_idx;
    DROP TABLE leases;
  `.execute(db);
}
