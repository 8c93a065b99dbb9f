import { sql } from 'kysely';
import { beforeAll, describe, expect, it } from 'vitest';
import { deviceLockSpace, lockHostRowsAndDevices } from '../../db/allocations/bookings.ts';
import type { RegisteredNode } from '../../db/nodes/fleet.ts';
import { useTestDatabase, waitForSessionsOnLock } from '../support/database.ts';
import { seedPool, smallShape } from '../support/fleet.ts';

// A pool-lease batch takes every lock it books under in one statement: the host-resource rows
// first, then the per-device locks. The order is what keeps it out of deadlocks with the inline
// placer and the guard trigger, so it is checked here, not assumed from the plan.

const t = useTestDatabase({ max: 10 });
let node: RegisteredNode;

beforeAll(async () => {
  const seeded = await seedPool(t.db, { nodes: 1, shape: { ...smallShape, resources: { vcpu: 16 } } });
  node = seeded.nodes[0]!;
});

function gate() {
  let open!: () => void;
  const opened = new Promise<void>((resolve) => {
    open = resolve;
  });
  return { open, opened };
}

/** Whether another session could take the per-device lock of `deviceId` right now. */
async function deviceLockFree(deviceId: string): Promise<boolean> {
  return t.db.transaction().execute(async (trx) => {
    const { rows } = await sql<{ got: boolean }>`
      SELECT pg_try_advisory_xact_lock(${deviceLockSpace}, hashtext(${deviceId}::text)) AS got`.execute(trx);
    return rows[0]!.got;
  });
}

describe('lockHostRowsAndDevices', () => {
  it('waits for a held host row before it takes any device lock, then holds both to commit', async () => {
    const deviceId = node.deviceIds[0]!;
    const rowHeld = gate();
    const releaseRow = gate();
    const holder = t.db.transaction().execute(async (trx) => {
      await sql`SELECT 1 FROM host_resources WHERE node_id = ${node.id} FOR UPDATE`.execute(trx);
      rowHeld.open();
      await releaseRow.opened;
    });
    await rowHeld.opened;

    const locked = gate();
    const releaseBatch = gate();
    const batch = t.db.transaction().execute(async (trx) => {
      await sql`SET LOCAL application_name = 'batch-locks'`.execute(trx);
      await lockHostRowsAndDevices(trx, { nodeIds: [node.id], resources: ['vcpu'] }, [deviceId]);
      locked.open();
      await releaseBatch.opened;
    });

    await waitForSessionsOnLock(t.db, 'batch-locks');
    // Blocked on the host row: not one device lock taken yet.
    expect(await deviceLockFree(deviceId)).toBe(true);

    releaseRow.open();
    await holder;
    await locked.opened;
    expect(await deviceLockFree(deviceId)).toBe(false);
    releaseBatch.open();
    await batch;
    expect(await deviceLockFree(deviceId)).toBe(true);
  });

  it('takes the device locks alone when no node books host resources', async () => {
    const deviceId = node.deviceIds[1]!;
    await t.db.transaction().execute(async (trx) => {
      await lockHostRowsAndDevices(trx, { nodeIds: [], resources: [] }, [deviceId]);
      expect(await deviceLockFree(deviceId)).toBe(false);
    });
    expect(await deviceLockFree(deviceId)).toBe(true);
  });
});
