import { sql, type Transaction } from 'kysely';
import { describe, expect, it } from 'vitest';
import type { Database } from '../../core/database.ts';
import { withPlacementTransaction } from '../../db/allocations/placement.ts';
import { fenceLease, poolLeaseName, takeLease } from '../../db/leases.ts';
import { countQueued, placeQueuedBatch } from '../../db/reservations/pool-queue.ts';
import { usePoolLeaseHarness } from './harness.ts';

// A pool-lease batch reads the queue, not the live reservations, however many are live and
// whatever the planner's statistics say about them. Statistics taken while nothing was live (a
// quiet pool, vacuumed) once made the partial index over live reservations look empty, and the
// batch's read scanned it whole for every queued row.
const h = usePoolLeaseHarness({ name: 'queue-read', nodes: 20, batchSize: 1, worker: false });

const live = 2_000;

/** How many rows of `reservations` this connection read, by a scan or through an index (not yet reported). */
const reservationRowsRead = async (trx: Transaction<Database>) => {
  const { rows } = await sql<{ n: string }>`
    SELECT seq_tup_read + COALESCE(idx_tup_fetch, 0) AS n
    FROM pg_stat_xact_user_tables WHERE relname = 'reservations'`.execute(trx);
  return Number(rows[0]?.n ?? 0);
};

describe('the pool-lease queue read', () => {
  it(`reads only the queue with ${live} live reservations the statistics do not know of`, async () => {
    const queuedIds: string[] = [];
    const createQueued = async (i: number) => {
      const res = await h.create(i % 2 ? h.acme : h.globex, `queued-${i}`);
      expect(res.status, JSON.stringify(res.body)).toBe(200);
      queuedIds.push(res.body.data.id);
    };
    await createQueued(0);
    // Copies of the first queued row, ended; the statistics taken while nothing is live (the first
    // row ended for that moment too); then the copies live again and more requests queued.
    await sql`
      INSERT INTO reservations
      SELECT (jsonb_populate_record(r, jsonb_build_object(
               'id', 'rsv_copy_' || g, 'idempotency_key', 'copy-' || g,
               'state', 'released', 'conditions', '[]'::jsonb))).*
      FROM reservations r, generate_series(1, ${live}) g WHERE r.id = ${queuedIds[0]}`.execute(h.db);
    await sql`UPDATE reservations SET state = 'released' WHERE id = ${queuedIds[0]}`.execute(h.db);
    await sql`VACUUM ANALYZE reservations`.execute(h.db);
    await sql`UPDATE reservations SET state = 'pending' WHERE id = ${queuedIds[0]}`.execute(h.db);
    await sql`UPDATE reservations SET state = 'placed' WHERE id LIKE 'rsv_copy_%'`.execute(h.db);
    for (let i = 1; i < 8; i++) await createQueued(i);

    const name = poolLeaseName(h.pool.poolId);
    const lease = await takeLease(h.db, { name, holder: 'tester', ttlMs: 60_000 });
    expect(lease).toBeTruthy();
    // One request a batch, so the statement runs often enough to be planned generically too.
    const reads: number[] = [];
    for (let i = 0; i < queuedIds.length; i++) {
      const batch = await withPlacementTransaction(h.db, async (trx) => {
        // The counters also hold the connection's earlier transactions until they are reported.
        const before = await reservationRowsRead(trx);
        const placed = await placeQueuedBatch(trx, {
          poolId: h.pool.poolId,
          batchSize: 1,
          fence: (t) => fenceLease(t, { name, holder: 'tester', epoch: lease!.epoch, ttlMs: 60_000 }),
        });
        reads.push((await reservationRowsRead(trx)) - before);
        return placed;
      });
      expect(batch.placed).toHaveLength(1);
    }
    expect(await countQueued(h.db, h.pool.poolId)).toBe(0);
    // Each batch reads the few queued rows and the one it places, never the live ones.
    for (const n of reads) expect(n).toBeLessThan(100);
  });
});
