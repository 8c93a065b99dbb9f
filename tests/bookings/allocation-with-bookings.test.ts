import { beforeAll, describe, expect, it } from 'vitest';
import { BookingConflict, insertAllocationWithBookings } from '../../db/allocations/bookings.ts';
import { checkBookingInvariants } from '../../db/allocations/invariants.ts';
import type { RegisteredNode } from '../../db/nodes/fleet.ts';
import { newId } from '../../domain/ids.ts';
import { insertBareAllocation } from '../support/allocations.ts';
import { useTestDatabase } from '../support/database.ts';
import { seedPool } from '../support/fleet.ts';

const hour = 3_600_000;
const start = new Date('2031-01-01T00:00:00Z');
const end = new Date(start.getTime() + 2 * hour);

const t = useTestDatabase({ max: 40 });
let poolId: string;
let node: RegisteredNode;

beforeAll(async () => {
  const pool = await seedPool(t.db, { nodes: 1 });
  poolId = pool.poolId;
  node = pool.nodes[0]!;
});

/**
 * A reservation of its own for each booking: a reservation holds at most one current allocation
 * per node. Its bare allocation (which books nothing) is superseded so the booking is its only one.
 */
async function newReservation(): Promise<string> {
  return t.db.transaction().execute(async (trx) => {
    const bare = await insertBareAllocation(trx, { poolId, nodeId: node.id, start, end });
    const row = await trx
      .updateTable('allocations')
      .set({ superseded_at: new Date() })
      .where('id', '=', bare)
      .returning('reservation_id')
      .executeTakeFirstOrThrow();
    return row.reservation_id!;
  });
}

const book = (deviceIds: string[], resources: { vcpu?: number; memoryGiB?: number }) => {
  const allocationId = newId('alloc');
  return {
    allocationId,
    run: async () => {
      const reservationId = await newReservation();
      return t.db.transaction().execute((trx) =>
        insertAllocationWithBookings(trx, {
          allocationId,
          reservationId,
          nodeId: node.id,
          deviceIds,
          resources,
          start,
          end,
        }),
      );
    },
  };
};

async function rowsOf(allocationId: string) {
  const count = async (table: 'allocations' | 'device_bookings' | 'scalar_bookings') =>
    Number(
      (
        await t.db
          .selectFrom(table)
          .select((eb) => eb.fn.countAll().as('n'))
          .where(table === 'allocations' ? 'id' : 'allocation_id', '=', allocationId)
          .executeTakeFirstOrThrow()
      ).n,
    );
  return {
    allocations: await count('allocations'),
    devices: await count('device_bookings'),
    scalars: await count('scalar_bookings'),
  };
}

describe('insertAllocationWithBookings (one statement)', () => {
  it('books the allocation, its devices and its host resources together', async () => {
    const first = book(node.deviceIds.slice(0, 2), { vcpu: 100, memoryGiB: 1000 });
    await first.run();
    expect(await rowsOf(first.allocationId)).toEqual({ allocations: 1, devices: 2, scalars: 2 });
  });

  it('refuses an overlapping device booking through the constraint and leaves nothing behind', async () => {
    const second = book(node.deviceIds.slice(1, 3), { vcpu: 1 });
    await expect(second.run()).rejects.toBeInstanceOf(BookingConflict);
    expect(await rowsOf(second.allocationId)).toEqual({ allocations: 0, devices: 0, scalars: 0 });
  });

  it('refuses host resources beyond allocatable (the guard trigger) and leaves nothing behind', async () => {
    const third = book(node.deviceIds.slice(4, 6), { vcpu: 100 });
    await expect(third.run()).rejects.toBeInstanceOf(BookingConflict);
    expect(await rowsOf(third.allocationId)).toEqual({ allocations: 0, devices: 0, scalars: 0 });
  });

  it('commits exactly one of 24 concurrent bookings of the same free devices', async () => {
    const attempts = Array.from({ length: 24 }, () => book(node.deviceIds.slice(6, 8), { vcpu: 1 }));
    const outcomes = await Promise.allSettled(attempts.map((a) => a.run()));
    expect(outcomes.filter((o) => o.status === 'fulfilled')).toHaveLength(1);
    for (const o of outcomes) {
      if (o.status === 'rejected') expect(o.reason).toBeInstanceOf(BookingConflict);
    }
    expect(await checkBookingInvariants(t.db)).toEqual({ deviceOverlaps: 0, scalarOverbookings: 0 });
  });
});
