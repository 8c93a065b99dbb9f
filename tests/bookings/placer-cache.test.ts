import { sql } from 'kysely';
import { beforeAll, describe, expect, it } from 'vitest';
import { createAdmissionCaches } from '../../core/admission-caches.ts';
import { findAndBook } from '../../db/allocations/placement.ts';
import { newId } from '../../domain/ids.ts';
import type { PlacementRequest } from '../../domain/placer.ts';
import type { NormalizedRequest } from '../../domain/reservation-request.ts';
import { useTestDatabase } from '../support/database.ts';
import { type SeededPool, seedPool } from '../support/fleet.ts';

const hour = 3_600_000;
const base = new Date('2030-01-01T00:00:00Z').getTime();
const window = { start: base, end: base + hour };
const request: PlacementRequest = {
  deviceClass: 'gpu',
  count: 1,
  topology: 'any',
  resources: { vcpu: 0, memoryGiB: 0, hugepages1Gi: 0 },
  requiredLabels: [],
};

const t = useTestDatabase();
let pool: SeededPool;

/** A pending reservation row for the placer to book (the booking layer below admission). */
async function pendingReservation(): Promise<string> {
  const id = newId('rsv');
  await t.db
    .insertInto('reservations')
    .values({
      id,
      tenant_id: 'tnt_test',
      pool_id: pool.poolId,
      owner_identity_id: 'idn_test',
      idempotency_key: id,
      request: JSON.stringify({
        poolId: pool.poolId,
        devices: [{ class: 'gpu', count: 1, topology: 'any' }],
        duration: '1h',
        durationMs: hour,
        binding: 'hold',
      } satisfies NormalizedRequest),
      request_hash: 'test',
      state: 'pending',
      duration_ms: hour,
    })
    .execute();
  return id;
}

async function place(caches: ReturnType<typeof createAdmissionCaches>) {
  const reservationId = await pendingReservation();
  return t.db
    .transaction()
    .execute((trx) =>
      findAndBook(trx, { poolId: pool.poolId, request, window, durationMs: hour, reservationId, caches }),
    );
}

beforeAll(async () => {
  // Above the placer's whole-pool limit (256), so it samples and uses its node cache.
  pool = await seedPool(t.db, { nodes: 300 });
});

describe("the placer's node cache in a large pool", () => {
  it('re-checks a cached node when booking: nodes cordoned or with unhealthy atoms since they were read are not booked', async () => {
    const caches = createAdmissionCaches();
    const first = await place(caches);
    expect(first.placed).toBe(true);
    const sampled = pool.nodes.map((n) => n.id);
    const { cached } = caches.placerNodes.lookup(pool.poolId, 'gpu', sampled, window);
    expect(cached.length).toBeGreaterThan(0);

    // Since the read: every node but two is cordoned, and one of those two has no healthy atom.
    const [open, sick] = [pool.nodes[299]!, pool.nodes[298]!];
    await sql`UPDATE nodes SET cordoned = true WHERE pool_id = ${pool.poolId} AND id NOT IN (${open.id}, ${sick.id})`.execute(
      t.db,
    );
    await sql`UPDATE devices SET health = 'unhealthy' WHERE node_id = ${sick.id}`.execute(t.db);

    // The cache still shows the cordoned nodes as they were; the booking's re-check refuses them.
    for (let i = 0; i < 2; i++) {
      const outcome = await place(caches);
      expect(outcome.placed).toBe(true);
      if (outcome.placed) expect(outcome.fit.nodeId).toBe(open.id);
    }
  });
});
