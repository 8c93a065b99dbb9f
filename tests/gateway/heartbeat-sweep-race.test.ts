import { sql } from 'kysely';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { insertPool, insertSite, registerReadyNodes } from '../../db/nodes/fleet.ts';
import { markSilentNodesUnreachable, recordHeartbeats } from '../../db/nodes/sessions.ts';
import { createTestDatabase, type TestDatabase } from '../support/database.ts';

let t: TestDatabase;
beforeAll(async () => {
  t = await createTestDatabase({ max: 5 });
});
afterAll(async () => {
  await t?.drop();
});

it('a heartbeat flush that met a sweep holding the node still revives it, one flush later', async () => {
  const siteId = await insertSite(t.db, { name: 's', region: 'eu-central-1' });
  const poolId = await insertPool(t.db, { siteId, ownerTenantId: 'tnt_root', name: 'p', gpuModel: 'h100' });
  const [node] = await registerReadyNodes(t.db, {
    siteId,
    poolId,
    count: 1,
    shape: { gpus: 1, gpuModel: 'h100', gpuMemoryMiB: 1, nvlinkDomainSize: 1, numaNodes: 1, resources: {} },
  });
  await sql`UPDATE nodes SET session_gateway = 'gw', last_heartbeat_at = compute_now() - interval '1 hour'`.execute(
    t.db,
  );
  let release!: () => void;
  const held = new Promise<void>((r) => (release = r));
  let marked!: () => void;
  const sweptP = new Promise<void>((r) => (marked = r));
  const sweep = t.db.transaction().execute(async (trx) => {
    const ids = await markSilentNodesUnreachable(trx, 40);
    marked();
    await held;
    return ids;
  });
  await sweptP;
  const heard = [{ nodeId: node!.id, epoch: 0 }];
  // The flush never waits for the sweep's row lock (so the two cannot deadlock): the node is deferred.
  const flush = await t.db.transaction().execute((trx) => recordHeartbeats(trx, 'gw', heard));
  expect(flush).toEqual({ revived: [], deferred: heard });
  release();
  expect(await sweep).toEqual([node!.id]);
  // The next flush finds the node the sweep marked unreachable, and connects it again.
  const next = await t.db.transaction().execute((trx) => recordHeartbeats(trx, 'gw', heard));
  expect(next).toEqual({ revived: [node!.id], deferred: [] });
  const conds = await t.db.selectFrom('node_conditions').selectAll().execute();
  expect(conds).toEqual([]);
});
