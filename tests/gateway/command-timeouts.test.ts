import { sql } from 'kysely';
import { beforeAll, describe, expect, it } from 'vitest';
import { advanceComputeClock } from '../../db/clock.ts';
import {
  enqueueNodeCommand,
  expireOverdueCommands,
  failTimedOutCommands,
  findNodeCommand,
} from '../../db/nodes/commands.ts';
import { useTestDatabase } from '../support/database.ts';
import { seedPool } from '../support/fleet.ts';

describe('command timeouts and expiry', () => {
  const t = useTestDatabase();
  let nodeId: string;
  beforeAll(async () => {
    nodeId = (await seedPool(t.db, { nodes: 1 })).nodes[0]!.id;
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
