import { sql } from 'kysely';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { advanceComputeClock } from '../../db/clock.ts';
import {
  enqueueNodeCommand,
  expireOverdueCommands,
  failTimedOutCommands,
  findNodeCommand,
} from '../../db/nodes/commands.ts';
import { insertPool, insertSite, registerReadyNodes } from '../../db/nodes/fleet.ts';
import { createTestDatabase, type TestDatabase } from '../support/database.ts';

describe('command timeouts and expiry', () => {
  let t: TestDatabase;
  let nodeId: string;
  beforeAll(async () => {
    t = await createTestDatabase();
    const siteId = await insertSite(t.db, { name: 's', region: 'eu-1' });
    const poolId = await insertPool(t.db, { siteId, ownerTenantId: 'tnt_root', name: 'p', gpuModel: 'h100' });
    nodeId = (await registerReadyNodes(t.db, { siteId, poolId, count: 1 }))[0]!.id;
  });
  afterAll(async () => {
    await t?.drop();
  });

  it('fails a delivered command past its kind timeout, and expires a queued one past not_after', async () => {
    const [diag, reset] = await t.db.transaction().execute(async (trx) => [
      await enqueueNodeCommand(trx, { nodeId, kind: 'diag.nvml', payload: {} }),
      await enqueueNodeCommand(trx, {
        nodeId,
        kind: 'gpu.reset',
        payload: { gpuUuid: 'GPU-x' },
        notAfter: new Date(Date.now() + 60_000),
      }),
    ]);
    await sql`UPDATE node_commands SET state = 'delivered', delivered_at = compute_now() WHERE id = ${diag!.id}`.execute(
      t.db,
    );
    expect(await failTimedOutCommands(t.db)).toBe(0);
    await advanceComputeClock(t.db, 6 * 60_000); // diag.nvml times out after 5 minutes
    expect(await failTimedOutCommands(t.db)).toBe(1);
    expect(await failTimedOutCommands(t.db)).toBe(0);
    expect(await findNodeCommand(t.db, diag!.id)).toMatchObject({
      state: 'failed',
      error: expect.stringContaining('timed out'),
    });
    expect(await expireOverdueCommands(t.db)).toBe(1);
    expect((await findNodeCommand(t.db, reset!.id))?.state).toBe('expired');
  });
});
