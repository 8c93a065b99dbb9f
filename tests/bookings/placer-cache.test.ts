import { sql } from 'kysely';
import { beforeAll, describe, expect, it } from 'vitest';
import { createAdmissionCaches } from '../../core/admission-caches.ts';
import { counterOfferHorizonMs, findAndBook } from '../../db/allocations/placement.ts';
import { loadPlacerNodes } from '../../db/allocations/placement-load.ts';
import { newId } from '../../domain/ids.ts';
import type { PlacementRequest, PlacerNode } from '../../domain/placer.ts';
import type { NormalizedRequest } from '../../domain/reservation-request.ts';
import { useTestDatabase } from '../support/database.ts';
import { type SeededPool, seedPool, smallShape } from '../support/fleet.ts';

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
async function pendingReservation(poolId = pool.poolId): Promise<string> {
  const id = newId('rsv');
  await t.db
    .insertInto('reservations')
    .values({
      id,
      tenant_id: 'tnt_test',
      pool_id: poolId,
      owner_identity_id: 'idn_test',
      idempotency_key: id,
      request: JSON.stringify({
        poolId,
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

describe('a large pool booked but for a few nodes', () => {
  // Nodes of two GPUs each, all of them asked for: a node either fits or is full.
  const whole: PlacementRequest = { ...request, count: 2 };
  const later = { start: base + 30 * 86_400_000, end: base + 30 * 86_400_000 + hour };
  let full: SeededPool;
  let free: Set<string>;

  const placeWhole = (caches: ReturnType<typeof createAdmissionCaches>) =>
    pendingReservation(full.poolId).then((reservationId) =>
      t.db.transaction().execute((trx) =>
        findAndBook(trx, {
          poolId: full.poolId,
          request: whole,
          window: later,
          durationMs: hour,
          reservationId,
          caches,
        }),
      ),
    );

  beforeAll(async () => {
    full = await seedPool(t.db, {
      site: 'room-site',
      name: 'h100-room',
      nodes: 300,
      shape: smallShape,
      namePrefix: 'room',
    });
    const caches = createAdmissionCaches();
    const booked = new Set<string>();
    for (let i = 0; i < 296; i++) {
      const outcome = await placeWhole(caches);
      if (!outcome.placed) throw new Error(`the pool was filled short: ${outcome.message}`);
      booked.add(outcome.fit.nodeId);
    }
    free = new Set(full.nodes.map((n) => n.id).filter((id) => !booked.has(id)));
    expect(free.size).toBe(4);
  });

  it('samples where a whole read found room: the last free nodes are found without reading the pool again', async () => {
    const caches = createAdmissionCaches();
    expect(caches.placerNodes.roomSample(full.poolId, 'gpu', later, 2, 8)).toBeUndefined();
    // A fresh process: its samples of 300 nodes rarely hold one of the 4 free ones; once it read
    // the pool whole, the room holds exactly the free nodes it has not booked since.
    const first = await placeWhole(caches);
    expect(first.placed).toBe(true);
    if (!first.placed) return;
    expect(free.has(first.fit.nodeId)).toBe(true);
    const room = caches.placerNodes.roomSample(full.poolId, 'gpu', later, 2, 8);
    if (room !== undefined) {
      expect(new Set(room)).toEqual(new Set([...free].filter((id) => id !== first.fit.nodeId)));
    }
    const second = await placeWhole(caches);
    expect(second.placed && free.has(second.fit.nodeId)).toBe(true);
    if (second.placed) free.delete(second.fit.nodeId);
    free.delete(first.fit.nodeId);
  });

  it('plans from a concurrent whole read: NoFit from one begun after the placement, never from an older one', async () => {
    const horizon = { start: later.start, end: later.start + counterOfferHorizonMs + hour };
    // A whole read of the pool as another placement would share it, showing every node full.
    const seenFull = (await t.db.transaction().execute(async (trx) => {
      const nodes = await loadPlacerNodes(trx, { poolId: full.poolId, deviceClass: 'gpu', horizon });
      for (const node of nodes) for (const d of node.devices) d.bookings.push(later);
      return nodes;
    })) as PlacerNode[];
    /** Caches whose room is empty (a whole read found none), so the samples look at nothing. */
    const noRoom = async () => {
      const caches = createAdmissionCaches();
      const read = Promise.resolve(seenFull);
      caches.placerNodes.shareWholeRead(
        full.poolId,
        'gpu',
        { startedAt: 0, horizon, window: later, nodes: read },
        () => 0,
      );
      await read;
      await Promise.resolve();
      expect(caches.placerNodes.roomSample(full.poolId, 'gpu', later, 2, 8)).toEqual([]);
      return caches;
    };
    /** A whole read running in `caches` begun at `startedAt`, answering once `placements` await it. */
    const running = (caches: ReturnType<typeof createAdmissionCaches>, startedAt: number, placements = 1) => {
      let resolve!: (nodes: PlacerNode[]) => void;
      const nodes = new Promise<PlacerNode[]>((r) => {
        resolve = r;
      });
      const then = nodes.then.bind(nodes);
      let awaited = 0;
      // The first `then` is the cache's own; the next ones, the placements planning from it.
      // biome-ignore lint/suspicious/noThenProperty: counting who awaits the read is the point
      nodes.then = ((onFulfilled, onRejected) => {
        if (++awaited === 1 + placements) resolve(seenFull);
        return then(onFulfilled, onRejected);
      }) as typeof nodes.then;
      caches.placerNodes.shareWholeRead(
        full.poolId,
        'gpu',
        { startedAt, horizon, window: later, nodes },
        () => 0,
      );
    };

    // Begun before the placement: planned as a sample only, then the pool is read afresh.
    const before = await noRoom();
    running(before, performance.now() - 1);
    const placed = await placeWhole(before);
    expect(placed.placed && free.has(placed.fit.nodeId)).toBe(true);
    if (placed.placed) free.delete(placed.fit.nodeId);
    expect(free.size).toBe(1);

    // Begun after it (as a read that started while this placement sampled): its NoFit stands.
    const after = await noRoom();
    running(after, performance.now() + 60_000, 2);
    // Two placements planning from it: one explains the NoFit, the other is answered alike.
    const [answered, alike] = await Promise.all([placeWhole(after), placeWhole(after)]);
    expect(answered.placed).toBe(false);
    if (!answered.placed) expect(answered.message).toMatch(/^0 of 300 nodes fit/);
    expect(alike).toEqual(answered);

    // Read by the placement itself, the last free node is found.
    const last = await placeWhole(await noRoom());
    expect(last.placed && free.has(last.fit.nodeId)).toBe(true);
  });
});

describe('a large pool placed in single statements', () => {
  // A single statement per try, as admission's first try (placeDraftAtOnce) makes it.
  const placeAtOnce = async (poolId: string, caches: ReturnType<typeof createAdmissionCaches>) =>
    findAndBook(t.db, {
      poolId,
      request,
      window,
      durationMs: hour,
      reservationId: await pendingReservation(poolId),
      caches,
      atOnce: () => ({ ctes: sql`nothing AS (SELECT 1)`, holds: sql<boolean>`true`, reason: 'none' }),
    });
  /** The transactional way, as admission places where its statement at once did not. */
  const placeInTransaction = async (
    poolId: string,
    caches: ReturnType<typeof createAdmissionCaches>,
    count = request.count,
  ) => {
    const reservationId = await pendingReservation(poolId);
    return t.db.transaction().execute((trx) =>
      findAndBook(trx, {
        poolId,
        request: { ...request, count },
        window,
        durationMs: hour,
        reservationId,
        caches,
      }),
    );
  };
  /** A pool of 300 nodes of 2 GPUs, above the whole-read limit. */
  const largePool = (name: string) =>
    seedPool(t.db, {
      site: `${name}-site`,
      name: `h100-${name}`,
      nodes: 300,
      shape: smallShape,
      namePrefix: name,
    });
  /** Whether a whole read of the pool ran or runs for these caches. */
  const readWhole = (poolId: string, caches: ReturnType<typeof createAdmissionCaches>) =>
    caches.placerNodes.roomSample(poolId, 'gpu', window, 1, 8) !== undefined ||
    caches.placerNodes.wholeReadCovering(poolId, 'gpu', window) !== undefined;

  it('is not read whole while its samples find room, however many it reads', async () => {
    const roomy = await largePool('roomy');
    const caches = createAdmissionCaches();
    // As admission places: a statement at once, and where its one sample found no fit (all 24
    // random nodes full, a few percent of the time once most are), the transactional way, whose
    // two more samples find room long before a whole read (three empty in a row: about 1 in 10^4).
    const place = async () => {
      const atOnce = await placeAtOnce(roomy.poolId, caches);
      return atOnce.placed ? atOnce : placeInTransaction(roomy.poolId, caches);
    };
    // 400 of its 600 GPUs: dozens of sample reads (counting those read it whole before).
    for (let i = 0; i < 400; i++) {
      expect((await place()).placed).toBe(true);
      expect(readWhole(roomy.poolId, caches)).toBe(false);
    }
  });

  it('is read whole in the background once its samples keep finding no fit, and then sampled from that room', async () => {
    const busy = await largePool('read');
    // 260 of its 300 nodes booked whole by another process (caches of their own).
    const filler = createAdmissionCaches();
    for (let i = 0; i < 260; i++) {
      const outcome = await placeInTransaction(busy.poolId, filler, 2);
      if (!outcome.placed) throw new Error(`the pool was filled short: ${outcome.message}`);
    }
    const caches = createAdmissionCaches();
    let tries = 0;
    while (caches.placerNodes.roomSample(busy.poolId, 'gpu', window, 1, 8) === undefined) {
      const running = caches.placerNodes.wholeReadCovering(busy.poolId, 'gpu', window);
      if (running) {
        await running.nodes;
        await Promise.resolve();
        continue;
      }
      // A sample of 24 of 300 nodes finds one of the 40 free ones almost always at first, less
      // often as this process books their 80 GPUs.
      await placeAtOnce(busy.poolId, caches);
      expect(++tries).toBeLessThan(200);
    }
    // Not at once: only after empty samples looked at half of the 300 nodes (7 samples of 24).
    expect(tries).toBeGreaterThanOrEqual(7);
    // The room: exactly the nodes with a free GPU (this process booked every one since the read).
    const room = caches.placerNodes.roomSample(busy.poolId, 'gpu', window, 1, 1_000)!;
    const { rows } = await sql<{ id: string }>`
      SELECT n.id FROM nodes n WHERE n.pool_id = ${busy.poolId} AND (
        SELECT count(*) FROM devices d JOIN device_bookings b ON b.device_id = d.id
        WHERE d.node_id = n.id AND b.during && tstzrange(${new Date(window.start)}, ${new Date(window.end)}, '[)')) < 2`.execute(
      t.db,
    );
    expect(room.length).toBeGreaterThan(0);
    expect(new Set(room)).toEqual(new Set(rows.map((r) => r.id)));
    const { cached, missing } = caches.placerNodes.lookup(busy.poolId, 'gpu', room, window);
    expect(missing).toEqual([]);
    expect(cached).toHaveLength(room.length);
    expect((await placeAtOnce(busy.poolId, caches)).placed).toBe(true);
  });
});
