import { type Kysely, sql } from 'kysely';

/**
 * Two indexes of `reservations`, so that no plan of the pool-lease queue can scan every live
 * reservation:
 * - the queue's index in the order its batches read it (by pool, then each tenant's requests
 *   oldest first: the fair turns), so the batch's read needs no sort;
 * - the live reservations' index led by `state` (the orphan sweep reads it oldest first).
 * It was `(updated_at)` over every live reservation, and statistics taken while none was live (a
 * quiet pool, vacuumed) made it look empty: the batch's read of the queue (`state = 'pending'`
 * implies its predicate) scanned it whole with the queue's predicate as a filter, 20 ms a batch at
 * 9,000 live reservations and growing with them (bench/README.md, 2026-12-07). Led by `state`, a
 * plan through it reads the pending rows only.
 */
export async function up(db: Kysely<any>): Promise<void> {
  await sql`
    DROP INDEX reservations_queued_idx;
    CREATE INDEX reservations_queue_idx ON reservations (pool_id, tenant_id, created_at, id)
      WHERE state = 'pending' AND conditions @> '[{"type":"Queued"}]';
    DROP INDEX reservations_live_idx;
    CREATE INDEX reservations_live_idx ON reservations (state, created_at)
      WHERE state NOT IN ('draft', 'denied', 'released', 'failed', 'cancelled', 'expired');
  `.execute(db);
}

export async function down(db: Kysely<any>): Promise<void> {
  await sql`
    DROP INDEX reservations_live_idx;
    CREATE INDEX reservations_live_idx ON reservations (updated_at)
      WHERE state NOT IN ('draft', 'denied', 'released', 'failed', 'cancelled', 'expired');
    DROP INDEX reservations_queue_idx;
    CREATE INDEX reservations_queued_idx ON reservations (pool_id, created_at)
      WHERE state = 'pending' AND conditions @> '[{"type":"Queued"}]';
  `.execute(db);
}
