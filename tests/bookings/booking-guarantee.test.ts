import { beforeAll, describe, expect, it } from 'vitest';
import {
  BookingConflict,
  insertDeviceBookings,
  insertScalarBookings,
  truncateAllocationBookings,
} from '../../db/allocations/bookings.ts';
import { checkBookingInvariants } from '../../db/allocations/invariants.ts';
import type { RegisteredNode } from '../../db/nodes/fleet.ts';
import type { HostResource } from '../../domain/fleet.ts';
import { insertBareAllocation } from '../support/allocations.ts';
import { useTestDatabase } from '../support/database.ts';
import { seedPool } from '../support/fleet.ts';

const hour = 3_600_000;
const base = new Date('2030-01-01T00:00:00Z').getTime();

interface Attempt {
  deviceIds: string[];
  start: Date;
  end: Date;
}

function overlaps(a: Attempt, b: Attempt) {
  return a.start < b.end && b.start < a.end && a.deviceIds.some((d) => b.deviceIds.includes(d));
}

/** A deterministic generator, so a failing round can be replayed from its seed. */
function random(seed: number) {
  let state = seed >>> 0;
  return () => {
    state = (state * 1_664_525 + 1_013_904_223) >>> 0;
    return state / 2 ** 32;
  };
}

const t = useTestDatabase({ max: 70 });
let poolId: string;
let nodes: RegisteredNode[];

beforeAll(async () => {
  ({ poolId, nodes } = await seedPool(t.db, { nodes: 4 }));
});

describe('the booking guarantee', () => {
  it('commits exactly a non-overlapping set out of 64 concurrent overlapping transactions', async () => {
    const node = nodes[0]!;
    const hot = node.deviceIds.slice(0, 4);
    const next = random(64);
    const attempts: Attempt[] = Array.from({ length: 64 }, () => {
      const first = Math.floor(next() * hot.length);
      const start = base + Math.floor(next() * 8) * hour;
      return {
        deviceIds: [hot[first]!, hot[(first + 1) % hot.length]!],
        start: new Date(start),
        end: new Date(start + (1 + Math.floor(next() * 3)) * hour),
      };
    });

    const outcomes = await Promise.allSettled(
      attempts.map((attempt) =>
        t.db.transaction().execute(async (trx) => {
          const allocationId = await insertBareAllocation(trx, { poolId, nodeId: node.id, ...attempt });
          await insertDeviceBookings(
            trx,
            attempt.deviceIds.map((deviceId) => ({
              deviceId,
              allocationId,
              start: attempt.start,
              end: attempt.end,
            })),
          );
        }),
      ),
    );

    const committed = attempts.filter((_, i) => outcomes[i]!.status === 'fulfilled');
    const refused = attempts.filter((_, i) => outcomes[i]!.status === 'rejected');
    for (const outcome of outcomes) {
      if (outcome.status === 'rejected') expect(outcome.reason).toBeInstanceOf(BookingConflict);
    }
    expect(committed.length).toBeGreaterThan(0);
    expect(refused.length).toBeGreaterThan(0);
    // No two committed attempts overlap, and every refusal collides with something committed.
    for (let i = 0; i < committed.length; i++) {
      for (let j = i + 1; j < committed.length; j++)
        expect(overlaps(committed[i]!, committed[j]!)).toBe(false);
    }
    for (const attempt of refused) expect(committed.some((c) => overlaps(c, attempt))).toBe(true);
    expect(await checkBookingInvariants(t.db)).toEqual({ deviceOverlaps: 0, scalarOverbookings: 0 });
    const { count } = await t.db
      .selectFrom('device_bookings')
      .select((eb) => eb.fn.countAll<string>().as('count'))
      .executeTakeFirstOrThrow();
    expect(Number(count)).toBe(committed.length * 2 + 0);
  });

  it('never over-books an atom or a scalar resource across random concurrent rounds', async () => {
    const next = random(20261129);
    const rounds = 25;
    const writers = 16;
    const resources: HostResource[] = ['vcpu', 'memoryGiB'];
    let committedTotal = 0;
    let refusedTotal = 0;
    for (let round = 0; round < rounds; round++) {
      const outcomes = await Promise.allSettled(
        Array.from({ length: writers }, () => {
          const node = nodes[Math.floor(next() * nodes.length)]!;
          const count = 1 + Math.floor(next() * 4);
          const firstDevice = Math.floor(next() * node.deviceIds.length);
          const deviceIds = Array.from(
            { length: count },
            (_, k) => node.deviceIds[(firstDevice + k) % node.deviceIds.length]!,
          );
          const start = new Date(base + Math.floor(next() * 48) * hour);
          const end = new Date(start.getTime() + (1 + Math.floor(next() * 12)) * hour);
          const vcpu = 8 + Math.floor(next() * 90);
          const memoryGiB = 64 + Math.floor(next() * 900);
          const truncateSomething = next() < 0.2;
          return t.db.transaction().execute(async (trx) => {
            const allocationId = await insertBareAllocation(trx, { poolId, nodeId: node.id, start, end });
            await insertDeviceBookings(
              trx,
              deviceIds.map((deviceId) => ({ deviceId, allocationId, start, end })),
            );
            await insertScalarBookings(
              trx,
              resources.map((resource) => ({
                allocationId,
                nodeId: node.id,
                resource,
                amount: resource === 'vcpu' ? vcpu : memoryGiB,
                start,
                end,
              })),
            );
            if (truncateSomething) {
              const victim = await trx
                .selectFrom('allocations')
                .select('id')
                .where('node_id', '=', node.id)
                .where('id', '<>', allocationId)
                .limit(1)
                .executeTakeFirst();
              if (victim) await truncateAllocationBookings(trx, victim.id);
            }
          });
        }),
      );
      for (const outcome of outcomes) {
        if (outcome.status === 'fulfilled') committedTotal += 1;
        else {
          refusedTotal += 1;
          expect(outcome.reason).toBeInstanceOf(BookingConflict);
        }
      }
      expect(await checkBookingInvariants(t.db), `round ${round}`).toEqual({
        deviceOverlaps: 0,
        scalarOverbookings: 0,
      });
    }
    expect(committedTotal).toBeGreaterThan(0);
    expect(refusedTotal).toBeGreaterThan(0);
  });

  it('refuses an overlapping booking even when a writer skips the locks (the constraint is the proof)', async () => {
    const node = nodes[3]!;
    const start = new Date(base + 500 * hour);
    const end = new Date(start.getTime() + hour);
    const bookWithoutLocks = () =>
      t.db.transaction().execute(async (trx) => {
        const allocationId = await insertBareAllocation(trx, { poolId, nodeId: node.id, start, end });
        await trx
          .insertInto('device_bookings')
          .values({
            device_id: node.deviceIds[0]!,
            allocation_id: allocationId,
            during: `[${start.toISOString()},${end.toISOString()})`,
          })
          .execute();
      });
    await bookWithoutLocks();
    await expect(bookWithoutLocks()).rejects.toMatchObject({ code: '23P01' });
  });

  it('refuses a scalar booking beyond allocatable and leaves nothing behind', async () => {
    const node = nodes[2]!;
    const start = new Date(base + 900 * hour);
    const end = new Date(start.getTime() + hour);
    await expect(
      t.db.transaction().execute(async (trx) => {
        const allocationId = await insertBareAllocation(trx, { poolId, nodeId: node.id, start, end });
        await insertScalarBookings(trx, [
          { allocationId, nodeId: node.id, resource: 'vcpu', amount: 193, start, end },
        ]);
      }),
    ).rejects.toBeInstanceOf(BookingConflict);
    const left = await t.db
      .selectFrom('scalar_bookings')
      .selectAll()
      .where('node_id', '=', node.id)
      .where('during', '&&' as never, `[${start.toISOString()},${end.toISOString()})`)
      .execute();
    expect(left).toEqual([]);
  });
});
