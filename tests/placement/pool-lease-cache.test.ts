import { sql } from 'kysely';
import { describe, expect, it } from 'vitest';
import { createAdmissionCaches } from '../../core/admission-caches.ts';
import { checkBookingInvariants } from '../../db/allocations/invariants.ts';
import { withPlacementTransaction } from '../../db/allocations/placement.ts';
import { fenceLease, poolLeaseName, takeLease } from '../../db/leases.ts';
import { placeQueuedBatch } from '../../db/reservations/pool-queue.ts';
import { usePoolLeaseHarness } from './harness.ts';

// The pool-lease batch reads its candidates through the placer's node cache: whatever changed on a
// cached node since is caught by the re-check under the batch's locks, never booked past.
const h = usePoolLeaseHarness({ name: 'pool-lease-cache', nodes: 3, batchSize: 4, worker: false });

describe("the pool-lease batch's cached candidates", () => {
  it('a cached node cordoned since it was read is not booked: the batch re-checks it under its locks', async () => {
    const caches = createAdmissionCaches();
    const name = poolLeaseName(h.pool.poolId);
    const lease = await takeLease(h.db, { name, holder: 'tester', ttlMs: 60_000 });
    const batch = () =>
      withPlacementTransaction(h.db, (trx) =>
        placeQueuedBatch(trx, {
          poolId: h.pool.poolId,
          batchSize: 4,
          caches,
          fence: (t) => fenceLease(t, { name, holder: 'tester', epoch: lease!.epoch, ttlMs: 60_000 }),
        }),
      );
    const nodeOf = async (reservationId: string) =>
      (
        await h.db
          .selectFrom('allocations')
          .where('reservation_id', '=', reservationId)
          .select('node_id')
          .executeTakeFirstOrThrow()
      ).node_id;

    const first = await h.create(h.acme, 'first');
    expect((await batch()).placed.map((p) => p.reservationId)).toEqual([first.body.data.id]);
    const used = await nodeOf(first.body.data.id);
    // The half-used node is the next 1-GPU request's best fit, and the cache still holds it
    // schedulable: only the re-check under the locks can see the cordon.
    await sql`UPDATE nodes SET cordoned = true WHERE id = ${used}`.execute(h.db);
    const second = await h.create(h.acme, 'second');
    const placed = await batch();
    expect(placed.placed.map((p) => p.reservationId)).toEqual([second.body.data.id]);
    expect(await nodeOf(second.body.data.id)).not.toBe(used);
    expect((await checkBookingInvariants(h.db)).deviceOverlaps).toBe(0);
  });
});
