import { type Kysely, sql } from 'kysely';

/**
 * Drops `allocations_live_created_idx` (2026-11-29T12): no query reads live allocations newest
 * first any more (the placer's samples come from its node cache), so the index was only written.
 * Worse, it misled the candidate read: planned on statistics taken while no allocation was live,
 * the per-node bookings lookup (`a.node_id = n.id AND a.state NOT IN (ended)`) scanned this whole
 * partial index with `node_id` as a filter instead of reading `allocations_node_idx`, so each
 * sample read cost more with every live allocation (measured: 681 rows filtered a node, 18.5 ms
 * a read of 8 nodes, where the node index takes about 2 ms; bench/README.md, 2026-12-05).
 */
export async function up(db: Kysely<any>): Promise<void> {
  await sql`DROP INDEX allocations_live_created_idx`.execute(db);
}

export async function down(db: Kysely<any>): Promise<void> {
  await sql`CREATE INDEX allocations_live_created_idx ON allocations (created_at DESC)
    WHERE state NOT IN ('released', 'failed')`.execute(db);
}
