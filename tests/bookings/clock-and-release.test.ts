import { beforeAll, describe, expect, it } from 'vitest';
import { insertDeviceBookings, truncateAllocationBookings } from '../../db/allocations/bookings.ts';
import { advanceComputeClock, freezeComputeClock, readComputeNow } from '../../db/clock.ts';
import type { RegisteredNode } from '../../db/nodes/fleet.ts';
import { insertBareAllocation } from '../support/allocations.ts';
import { useTestDatabase } from '../support/database.ts';
import { seedPool } from '../support/fleet.ts';

const hour = 3_600_000;
const t = useTestDatabase();
let poolId: string;
let node: RegisteredNode;

beforeAll(async () => {
  const pool = await seedPool(t.db, { site: 'clock-site', nodes: 1 });
  poolId = pool.poolId;
  node = pool.nodes[0]!;
});

describe('the one clock', () => {
  it('moves when tests move it, and release truncates at compute_now()', async () => {
    const frozen = new Date('2031-03-01T12:00:00Z');
    await freezeComputeClock(t.db, frozen);
    expect((await readComputeNow(t.db)).toISOString()).toBe(frozen.toISOString());

    const current = { start: new Date(frozen.getTime() - hour), end: new Date(frozen.getTime() + 3 * hour) };
    const future = {
      start: new Date(frozen.getTime() + 5 * hour),
      end: new Date(frozen.getTime() + 6 * hour),
    };
    const allocationId = await t.db.transaction().execute(async (trx) => {
      const id = await insertBareAllocation(trx, { poolId, nodeId: node.id, ...current });
      await insertDeviceBookings(trx, [
        { deviceId: node.deviceIds[0]!, allocationId: id, ...current },
        { deviceId: node.deviceIds[1]!, allocationId: id, ...future },
      ]);
      return id;
    });

    await advanceComputeClock(t.db, hour);
    const releasedAt = new Date(frozen.getTime());
    expect((await readComputeNow(t.db)).toISOString()).toBe(releasedAt.toISOString()); // frozen wins over offset
    await freezeComputeClock(t.db, new Date(frozen.getTime() + hour));
    await t.db.transaction().execute((trx) => truncateAllocationBookings(trx, allocationId));
    await t.db.transaction().execute((trx) => truncateAllocationBookings(trx, allocationId)); // idempotent

    const rows = await t.db
      .selectFrom('device_bookings')
      .select(['device_id', (eb) => eb.fn<string>('upper', ['during']).as('ends')])
      .where('allocation_id', '=', allocationId)
      .execute();
    expect(rows).toHaveLength(1);
    expect(rows[0]!.device_id).toBe(node.deviceIds[0]);
    expect(new Date(rows[0]!.ends).toISOString()).toBe(new Date(frozen.getTime() + hour).toISOString());
    await freezeComputeClock(t.db, null);
  });
});
