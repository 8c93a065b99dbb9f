import { sql } from 'kysely';
import { beforeAll, describe, expect, it } from 'vitest';
import { createAdmissionCaches } from '../../core/admission-caches.ts';
import { checkBookingInvariants } from '../../db/allocations/invariants.ts';
import { withPlacementTransaction } from '../../db/allocations/placement.ts';
import { fenceLease, poolLeaseName, takeLease } from '../../db/leases.ts';
import { placeQueuedBatch } from '../../db/reservations/pool-queue.ts';
import { insertBareAllocation } from '../support/allocations.ts';
import { smallShape } from '../support/fleet.ts';
import { type PoolLeaseHarness, usePoolLeaseHarness } from './harness.ts';

// The pool-lease batch reads its candidates through the placer's node cache: whatever changed on a
// cached node since is caught by the re-check under the batch's locks, never booked past.

/** A pool of three nodes of two GPUs and 16 vCPUs (a GPU's reservation books 8), batched by hand. */
function useCachedBatches(name: string) {
  const h = usePoolLeaseHarness({
    name,
    nodes: 3,
    batchSize: 4,
    worker: false,
    shape: { ...smallShape, resources: { vcpu: 16 } },
  });
  const caches = createAdmissionCaches();
  let epoch = 0;
  beforeAll(async () => {
    epoch = (await takeLease(h.db, { name: poolLeaseName(h.pool.poolId), holder: 'tester', ttlMs: 600_000 }))!
      .epoch;
  });
  /** One batch of the pool's queue, through the test's own node cache. */
  const batch = () =>
    withPlacementTransaction(h.db, (trx) =>
      placeQueuedBatch(trx, {
        poolId: h.pool.poolId,
        batchSize: 4,
        caches,
        fence: (t) =>
          fenceLease(t, { name: poolLeaseName(h.pool.poolId), holder: 'tester', epoch, ttlMs: 600_000 }),
      }),
    );
  return {
    h,
    /** The node a 1-GPU request was placed on by a batch that placed it alone. */
    async placeAlone(key: string): Promise<string> {
      const created = await h.create(h.acme, key);
      const placed = await batch();
      expect(placed.placed.map((p) => p.reservationId)).toEqual([created.body.data.id]);
      return nodeOf(h, created.body.data.id);
    },
  };
}

async function nodeOf(h: PoolLeaseHarness, reservationId: string): Promise<string> {
  const row = await h.db
    .selectFrom('allocations')
    .where('reservation_id', '=', reservationId)
    .select('node_id')
    .executeTakeFirstOrThrow();
  return row.node_id;
}

describe('a cached node cordoned since it was read', () => {
  const { h, placeAlone } = useCachedBatches('pool-lease-cache-cordon');

  it('is not booked: the batch re-checks it under its locks', async () => {
    const used = await placeAlone('first');
    // The half-used node is the next 1-GPU request's best fit, and the cache still holds it
    // schedulable: only the re-check under the locks can see the cordon.
    await sql`UPDATE nodes SET cordoned = true WHERE id = ${used}`.execute(h.db);
    expect(await placeAlone('second')).not.toBe(used);
    expect((await checkBookingInvariants(h.db)).deviceOverlaps).toBe(0);
  });
});

describe('a cached node whose vCPUs were booked since it was read', () => {
  const { h, placeAlone } = useCachedBatches('pool-lease-cache-room');

  it('is not booked: the batch re-checks the room under its locks', async () => {
    const half = await placeAlone('first');
    // The node's other 8 vCPUs go to a booking the cache never saw; its free GPU still looks free.
    await h.db.transaction().execute(async (trx) => {
      const start = new Date('2020-01-01T00:00:00Z');
      const end = new Date('2100-01-01T00:00:00Z');
      const allocationId = await insertBareAllocation(trx, {
        poolId: h.pool.poolId,
        nodeId: half,
        start,
        end,
      });
      await sql`INSERT INTO scalar_bookings (allocation_id, node_id, resource, amount, during)
                VALUES (${allocationId}, ${half}, 'vcpu', 8, tstzrange(${start}, ${end}, '[)'))`.execute(trx);
    });
    expect(await placeAlone('second')).not.toBe(half);
    expect(await checkBookingInvariants(h.db)).toEqual({ deviceOverlaps: 0, scalarOverbookings: 0 });
  });
});
