import { sql } from 'kysely';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { insertPool, insertSite, registerReadyNodes } from '../../db/nodes/fleet.ts';
import { markSilentNodesUnreachable, recordHeartbeats } from '../../db/nodes/sessions.ts';
import { createTestDatabase, type TestDatabase } from '../support/database.ts';
import { eventually } from '../support/eventually.ts';

let t: TestDatabase;
beforeAll(async () => {
  t = await createTestDatabase({ max: 5 });
});
afterAll(async () => {
  await t?.drop();
});

it('a heartbeat flush that waited for a sweep still revives the node', async () => {
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
  const flush = t.db
    .transaction()
    .execute((trx) => recordHeartbeats(trx, 'gw', [{ nodeId: node!.id, epoch: 0 }]));
  // The flush is blocked on the sweep's row lock (not merely started) before the sweep commits.
  await eventually(async () => {
    const { rows } = await sql<{ waiting: number }>`
      SELECT count(*)::int AS waiting FROM pg_stat_activity
      WHERE datname = current_database() AND wait_event_type = 'Lock'`.execute(t.db);
    return rows[0]!.waiting > 0;
  });
  release();
  expect(await sweep).toEqual([node!.id]);
  expect(await flush).toEqual([node!.id]);
  const conds = await t.db.selectFrom('node_conditions').selectAll().execute();
  expect(conds).toEqual([]);
});
