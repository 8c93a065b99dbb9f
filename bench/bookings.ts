/**
 * What the booking guarantee costs. Loads 100,000 devices, then measures bookings per second
 * through the project's own booking code (db/bookings.ts: per-device advisory locks in a fixed
 * order, then the insert the EXCLUDE constraint referees):
 *   1. no contention, 8 connections, guarded;
 *   2. the same inserts into a copy of the table without the constraint and without locks;
 *   3. contention: 16 writers on 8 hot devices, guarded (deadlocks must be 0, p99 is the figure);
 *   4. the same contention without the advisory locks, to show why they exist.
 * Usage: node --import tsx bench/bookings.ts [--seconds 10] [--devices 100000]
 */
import { parseArgs } from 'node:util';
import { sql } from 'kysely';
import { BookingConflict, insertDeviceBookings } from '../db/allocations/bookings.ts';
import { checkBookingInvariants } from '../db/allocations/invariants.ts';
import { h100Shape, insertPool, insertSite, registerReadyNodes } from '../db/nodes/fleet.ts';
import { benchDatabase, prepareBookingLoad, runLoad } from './support.ts';

const { values } = parseArgs({
  options: { seconds: { type: 'string', default: '10' }, devices: { type: 'string', default: '100000' } },
});
const seconds = Number(values.seconds);
const deviceCount = Number(values.devices);
const hour = 3_600_000;
const epoch = Date.UTC(2030, 0, 1);

const bench = await benchDatabase('bookings', { max: 40 });
try {
  const t0 = performance.now();
  const siteId = await insertSite(bench.db, { name: 'bench', region: 'eu-central-1' });
  const poolId = await insertPool(bench.db, {
    siteId,
    ownerTenantId: 'tnt_root',
    name: 'h100',
    gpuModel: 'h100',
  });
  const nodes = await registerReadyNodes(bench.db, {
    siteId,
    poolId,
    count: Math.ceil(deviceCount / h100Shape.gpus),
  });
  const devices = nodes.flatMap((n) => n.deviceIds).slice(0, deviceCount);
  // One allocation per booking attempt, created up front so the loop measures bookings only.
  const load = await prepareBookingLoad(bench.db, { poolId, nodeId: nodes[0]!.id, deviceIds: devices });
  await sql`VACUUM ANALYZE`.execute(bench.db);
  console.log(
    `loaded ${devices.length} devices on ${nodes.length} nodes in ${((performance.now() - t0) / 1000).toFixed(1)} s`,
  );

  const allocation = load.allocation;
  const guarded = await load.guarded(8, seconds);
  console.log('1. no contention, 8 connections, guarded:', guarded);

  const unguarded = await load.unguarded(8, seconds);
  console.log('2. no contention, 8 connections, no constraint and no locks:', unguarded);

  const hot = devices.slice(0, 8);
  // 16 writers on 8 hot devices, each booking two neighbours for a random slot of 2,000.
  const hotAttempt = () => {
    const first = Math.floor(Math.random() * hot.length);
    const start = new Date(epoch + (10_000 + Math.floor(Math.random() * 2_000)) * hour);
    const allocationId = allocation();
    return [hot[first]!, hot[(first + 1) % hot.length]!].map((deviceId) => ({
      deviceId,
      allocationId,
      start,
      end: new Date(start.getTime() + hour),
    }));
  };
  const contended = await runLoad(16, seconds, async () => {
    const bookings = hotAttempt();
    try {
      await bench.db.transaction().execute((trx) => insertDeviceBookings(trx, bookings));
      return true;
    } catch (error) {
      if (error instanceof BookingConflict) return false;
      throw error;
    }
  });
  console.log('3. contention, 16 writers on 8 hot devices, guarded:', contended);

  const naive = await runLoad(16, Math.min(seconds, 10), async () => {
    const bookings = hotAttempt().map((b) => ({
      ...b,
      start: new Date(b.start.getTime() + 5_000 * hour),
      end: new Date(b.end.getTime() + 5_000 * hour),
    }));
    try {
      await bench.db.transaction().execute(async (trx) => {
        // Descending order on purpose for half of the writers: what unordered code does.
        for (const b of Math.random() < 0.5 ? bookings : [...bookings].reverse()) {
          await sql`INSERT INTO device_bookings (device_id, allocation_id, during)
                    VALUES (${b.deviceId}, ${b.allocationId}, tstzrange(${b.start}, ${b.end}, '[)'))`.execute(
            trx,
          );
        }
      });
      return true;
    } catch (error) {
      if ((error as { code?: string }).code === '23P01') return false;
      throw error;
    }
  });
  console.log('4. contention, 16 writers on 8 hot devices, constraint only (no advisory locks):', naive);

  const invariants = await checkBookingInvariants(bench.db);
  console.log('invariants after the run:', invariants);
  console.log(
    JSON.stringify({
      devices: devices.length,
      guardedPerSecond: guarded.perSecond,
      unguardedPerSecond: unguarded.perSecond,
      guardCostRatio: Number((guarded.perSecond / unguarded.perSecond).toFixed(2)),
      contended: {
        perSecond: contended.perSecond,
        p50Ms: contended.p50Ms,
        p99Ms: contended.p99Ms,
        errors: contended.errors,
      },
      naive: { perSecond: naive.perSecond, p99Ms: naive.p99Ms, errors: naive.errors },
      invariants,
    }),
  );
} finally {
  await bench.dispose();
}
