import { sql } from 'kysely';
import { beforeAll, describe, expect, it } from 'vitest';
import { BookingConflict } from '../../db/allocations/bookings.ts';
import { checkBookingInvariants } from '../../db/allocations/invariants.ts';
import { tryInsertAllocationWithBookings } from '../../db/allocations/try-book.ts';
import type { RegisteredNode } from '../../db/nodes/fleet.ts';
import { applyNodeInventory } from '../../db/nodes/inventory.ts';
import { lockNodeAtEpoch } from '../../db/nodes/sessions.ts';
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
        tryInsertAllocationWithBookings(trx, {
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

describe('tryInsertAllocationWithBookings (one statement)', () => {
  it('books the allocation, its devices and its host resources together', async () => {
    const first = book(node.deviceIds.slice(0, 2), { vcpu: 100, memoryGiB: 1000 });
    expect(await first.run()).toBe('booked');
    expect(await rowsOf(first.allocationId)).toEqual({ allocations: 1, devices: 2, scalars: 2 });
  });

  it('answers stale for a device booked over the window and leaves nothing behind', async () => {
    const second = book(node.deviceIds.slice(1, 3), { vcpu: 1 });
    expect(await second.run()).toBe('stale');
    expect(await rowsOf(second.allocationId)).toEqual({ allocations: 0, devices: 0, scalars: 0 });
  });

  it('answers stale for host resources beyond allocatable and leaves nothing behind', async () => {
    const third = book(node.deviceIds.slice(4, 6), { vcpu: 100 });
    expect(await third.run()).toBe('stale');
    expect(await rowsOf(third.allocationId)).toEqual({ allocations: 0, devices: 0, scalars: 0 });
  });

  it('commits exactly one of 24 concurrent bookings of the same free devices', async () => {
    const attempts = Array.from({ length: 24 }, () => book(node.deviceIds.slice(6, 8), { vcpu: 1 }));
    const outcomes = await Promise.allSettled(attempts.map((a) => a.run()));
    const booked = outcomes.filter((o) => o.status === 'fulfilled' && o.value === 'booked');
    expect(booked).toHaveLength(1);
    for (const o of outcomes) {
      // The losers were locked out, saw the winner's booking, or met the constraint.
      if (o.status === 'rejected') expect(o.reason).toBeInstanceOf(BookingConflict);
      else if (o.value !== 'booked') expect(['locked', 'stale']).toContain(o.value);
    }
    expect(await checkBookingInvariants(t.db)).toEqual({ deviceOverlaps: 0, scalarOverbookings: 0 });
  });
});

describe('a booking beside the node inventory', () => {
  // The inventory holds the node's row (at the session's epoch) and then writes the node's host
  // rows; a booking holds those host rows and then checks its foreign key to the node. With
  // FOR UPDATE on the node's row the two waited on each other (CI saw `deadlock detected`).
  it('is not held up by the inventory holding the node, and the inventory then writes the host rows', async () => {
    const reservationId = await newReservation();
    const { epoch } = await t.db
      .selectFrom('nodes')
      .where('id', '=', node.id)
      .select('epoch')
      .executeTakeFirstOrThrow();
    let nodeLocked!: () => void;
    const locked = new Promise<void>((resolve) => {
      nodeLocked = resolve;
    });
    let bookingDone!: () => void;
    const booked = new Promise<void>((resolve) => {
      bookingDone = resolve;
    });
    const inventory = t.db.transaction().execute(async (trx) => {
      expect(await lockNodeAtEpoch(trx, { nodeId: node.id, epoch: Number(epoch) }, 'update')).toBe(true);
      nodeLocked();
      await booked;
      await applyNodeInventory(
        trx,
        { nodeId: node.id, epoch: Number(epoch) },
        {
          host: { hostname: node.name, vcpu: 192, memoryGiB: 2048, hugepages1Gi: 512, pciGpuCount: 8 },
        },
      );
    });
    await locked;
    const booking = await t.db
      .transaction()
      .execute(async (trx) => {
        // Only so that the old lock fails this test quickly instead of at the test's timeout.
        await sql`SET LOCAL lock_timeout = '20s'`.execute(trx);
        const verdict = await tryInsertAllocationWithBookings(trx, {
          allocationId: newId('alloc'),
          reservationId,
          nodeId: node.id,
          deviceIds: [node.deviceIds[7]!],
          resources: { vcpu: 1 },
          // A window of its own: the cases above booked the node's devices over start..end.
          start: new Date(end.getTime() + hour),
          end: new Date(end.getTime() + 2 * hour),
        });
        return verdict;
      })
      .finally(bookingDone);
    await inventory;
    expect(booking).toBe('booked');
    expect(await checkBookingInvariants(t.db)).toEqual({ deviceOverlaps: 0, scalarOverbookings: 0 });
  });
});
