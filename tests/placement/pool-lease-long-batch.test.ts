import { sql } from 'kysely';
import { describe, expect, it } from 'vitest';
import { lockDevices } from '../../db/allocations/bookings.ts';
import { findLease, poolLeaseName } from '../../db/leases.ts';
import { eventually } from '../support/eventually.ts';
import { usePoolLeaseHarness } from './harness.ts';

// A batch that works longer than the lease's TTL keeps the lease: the holder renews it while its
// batches run. Before, such a batch (in a nearly full pool, every request read against the whole
// pool) lost the lease before its fence, rolled back and was tried again the same way forever.
const leaseTtlMs = 600;
const h = usePoolLeaseHarness({
  name: 'pool-lease-long-batch',
  nodes: 4,
  batchSize: 4,
  poolPlacer: { leaseTtlMs, pollMs: 200 },
});

describe('a pool-lease batch slower than the lease', () => {
  it('keeps the lease while it waits and commits under the epoch it began with', async () => {
    const devices = await h.db
      .selectFrom('devices')
      .innerJoin('nodes', 'nodes.id', 'devices.node_id')
      .where('nodes.pool_id', '=', h.pool.poolId)
      .select('devices.id')
      .execute();
    const name = poolLeaseName(h.pool.poolId);
    let release: () => void = () => {};
    const held = new Promise<void>((resolve) => {
      release = resolve;
    });
    // Every device of the pool locked by another writer: the batch waits at its booking.
    const blocker = h.db.transaction().execute(async (trx) => {
      await lockDevices(
        trx,
        devices.map((d) => d.id),
      );
      await held;
    });
    try {
      const created = h.create(h.acme, 'slow-1', { wait: { timeoutMs: 30_000 } });
      // The batch is waiting for the device locks ...
      await eventually(async () => {
        const { rows } = await sql<{ n: number }>`
          SELECT count(*)::int AS n FROM pg_locks WHERE locktype = 'advisory' AND NOT granted`.execute(h.db);
        return rows[0]!.n > 0;
      });
      const first = await findLease(h.db, name);
      expect(first).toMatchObject({ expired: false });
      // ... for three of the lease's lifetimes, renewed meanwhile, by the same holder and epoch.
      const waitedFrom = first!.expiresAt.getTime();
      await eventually(async () => {
        const lease = await findLease(h.db, name);
        return lease && !lease.expired && lease.expiresAt.getTime() > waitedFrom + 3 * leaseTtlMs && lease;
      });
      expect(await findLease(h.db, name)).toMatchObject({
        holder: first!.holder,
        epoch: first!.epoch,
        expired: false,
      });
      release();
      const answer = await created;
      expect(answer.status, JSON.stringify(answer.body)).toBe(200);
      expect(answer.body.data).toMatchObject({ state: 'placed', operation: { state: 'succeeded' } });
      // Placed by the batch that waited: under the first epoch.
      const audit = await sql<{ epoch: string }>`
        SELECT context->>'epoch' AS epoch FROM audit_events
        WHERE resource_id = ${answer.body.data.id} AND action = 'compute:pool-placer:placed'`.execute(h.db);
      expect(audit.rows.map((a) => Number(a.epoch))).toEqual([first!.epoch]);
    } finally {
      release();
      await blocker;
    }
  });
});
