/**
 * BookingRepair at scale: 200 calendar reservations (whole 8-GPU nodes, through
 * `reservations.create` with their lifecycles) in a 1,000-node pool; 10% of the pool (100 nodes)
 * is cordoned, every node holding a booking first, so half of the reservations must move. The
 * compute clock is moved to 14 minutes before their start and each lifecycle woken (what its
 * pre-start timer does in production): the figure is the time until every reservation is repaired.
 * Baseline in the same run: the same pass over 200 other reservations with nothing cordoned (200
 * BookingRepair workflows that find every member healthy).
 * Usage: node --import tsx bench/booking-repair.ts [--nodes 1000] [--reservations 200] [--cordon 0.1]
 */
import { randomBytes } from 'node:crypto';
import { loadavg } from 'node:os';
import { parseArgs } from 'node:util';
import { sql } from 'kysely';
import { parseConfig } from '../core/config.ts';
import { createLogger } from '../core/logger.ts';
import { advanceComputeClock, readComputeNow } from '../db/clock.ts';
import { offerPool, registerReadyNodes } from '../db/nodes/fleet.ts';
import { bootstrapPlatform } from '../iam/bootstrap.ts';
import { createEmbeddedIam } from '../iam/embedded/index.ts';
import { createCompute } from '../server/compute.ts';
import { connectTemporal } from '../temporal/client.ts';
import { createTemporalLifecycle } from '../temporal/lifecycle.ts';
import { startWorker } from '../temporal/worker.ts';
import { benchDatabase, benchTemporal, insertBenchPool } from './support.ts';

const { values } = parseArgs({
  options: {
    nodes: { type: 'string', default: '1000' },
    reservations: { type: 'string', default: '200' },
    cordon: { type: 'string', default: '0.1' },
  },
});
const nodeCount = Number(values.nodes);
const total = Number(values.reservations);
const cordonCount = Math.round(nodeCount * Number(values.cordon));
const log = createLogger({ level: 'warn', name: 'bench' });
const hour = 3_600_000;

const bench = await benchDatabase('repair', { max: 24 });
const { address, stop: stopTemporal } = await benchTemporal(log);
const taskQueue = `bench-repair-${randomBytes(4).toString('hex')}`;
const temporal = await connectTemporal({ address });
const iam = createEmbeddedIam({ db: bench.db, log });
const worker = await startWorker({ db: bench.db, log, iam, address, taskQueue, sweeper: false });

try {
  await bootstrapPlatform(iam);
  await iam.admin.createTenant({ id: 'acme', name: 'acme' });
  const identity = await iam.admin.createIdentity({ tenantId: 'acme', kind: 'service', name: 'bench' });
  await iam.admin.bindRole({ identityId: identity.id, role: 'member' });
  const credential = { token: (await iam.admin.createToken({ identityId: identity.id })).token };
  const { siteId, poolId } = await insertBenchPool(bench.db);
  await registerReadyNodes(bench.db, { siteId, poolId, count: nodeCount });
  await offerPool(bench.db, { poolId, tenantId: 'acme', quota: { gpu: 16 * total + 64 } });
  const lifecycle = createTemporalLifecycle(temporal.client, { taskQueue });
  const compute = createCompute({
    config: parseConfig({}),
    db: bench.db,
    log,
    iam,
    lifecycle,
    temporal: temporal.client,
  });

  const now = (await readComputeNow(bench.db)).getTime();
  // Two groups: the baseline's (nothing to repair) starts at +2 h, the measured one at +4 h.
  const groups = { baseline: now + 2 * hour, cordoned: now + 4 * hour };
  const ids: Record<keyof typeof groups, string[]> = { baseline: [], cordoned: [] };
  const t0 = performance.now();
  for (const [group, start] of Object.entries(groups) as Array<[keyof typeof groups, number]>) {
    for (let i = 0; i < total; i++) {
      const r = await compute.api.reservations.create(credential, {
        tenantId: 'acme',
        poolId,
        devices: [{ class: 'gpu', count: 8 }],
        duration: '1h',
        start,
        idempotencyKey: `${group}-${i}`,
      });
      if (r.state !== 'placed') throw new Error(`reservation ${i} of ${group} is ${r.state}`);
      ids[group].push(r.id);
    }
  }
  console.log(
    `${2 * total} calendar reservations created in ${((performance.now() - t0) / 1000).toFixed(1)} s`,
  );
  // Every lifecycle has taken its first look (so the passes below measure the repairs alone).
  for (;;) {
    const { rows } = await sql<{ n: string }>`SELECT count(*) AS n FROM reservations
      WHERE pool_id = ${poolId} AND lifecycle_started_at IS NOT NULL`.execute(bench.db);
    if (Number(rows[0]!.n) >= 2 * total) break;
    await new Promise((resolve) => setTimeout(resolve, 250));
  }

  /** Moves the clock to 14 minutes before `start`, wakes the group's lifecycles, waits until `done`. */
  const pass = async (group: keyof typeof groups, done: () => Promise<boolean>) => {
    const current = (await readComputeNow(bench.db)).getTime();
    await advanceComputeClock(bench.db, groups[group] - 14 * 60_000 - current);
    const started = performance.now();
    for (let i = 0; i < ids[group].length; i += 50) {
      await Promise.all(
        ids[group].slice(i, i + 50).map((id) => lifecycle.signal(id, { type: 'wake', reason: 'bench' })),
      );
    }
    for (;;) {
      if (await done()) break;
      if (performance.now() - started > 600_000) throw new Error(`the ${group} pass did not finish`);
      await new Promise((resolve) => setTimeout(resolve, 100));
    }
    return (performance.now() - started) / 1000;
  };
  const repairWorkflows = async (status: string) =>
    Number(
      (
        await temporal.client.workflow.count(
          `WorkflowType = 'bookingRepair' AND ExecutionStatus = '${status}' AND ComputePool = '${poolId}'`,
        )
      ).count,
    );

  const baselineSeconds = await pass('baseline', async () => (await repairWorkflows('Completed')) >= total);
  const baselineLoad = loadavg()[0]!;

  // Cordon 10% of the pool: every node holding a booking of the measured group first.
  const { rows: held } = await sql<{ node_id: string }>`
    SELECT DISTINCT a.node_id FROM allocations a WHERE a.reservation_id = ANY(${ids.cordoned}::text[])
      AND a.superseded_at IS NULL ORDER BY a.node_id LIMIT ${cordonCount}`.execute(bench.db);
  const cordoned = held.map((r) => r.node_id);
  if (cordoned.length < cordonCount) {
    const { rows } = await sql<{ id: string }>`SELECT id FROM nodes WHERE pool_id = ${poolId}
      AND NOT (id = ANY(${cordoned}::text[])) ORDER BY id LIMIT ${cordonCount - cordoned.length}`.execute(
      bench.db,
    );
    cordoned.push(...rows.map((r) => r.id));
  }
  await bench.db.updateTable('nodes').set({ cordoned: true }).where('id', 'in', cordoned).execute();
  const { rows: affectedRows } = await sql<{ n: string }>`
    SELECT count(DISTINCT a.reservation_id) AS n FROM allocations a
    WHERE a.reservation_id = ANY(${ids.cordoned}::text[]) AND a.superseded_at IS NULL
      AND a.node_id = ANY(${cordoned}::text[])`.execute(bench.db);
  const affected = Number(affectedRows[0]!.n);
  const repaired = async () => {
    const { rows } = await sql<{
      n: string;
    }>`SELECT count(DISTINCT reservation_id) AS n FROM reservation_repairs
      WHERE outcome = 'repaired' AND reservation_id = ANY(${ids.cordoned}::text[])`.execute(bench.db);
    return Number(rows[0]!.n);
  };
  let allRepairedSeconds: number | null = null;
  const passStarted = performance.now();
  const cordonedSeconds = await pass('cordoned', async () => {
    if (allRepairedSeconds === null && (await repaired()) >= affected) {
      allRepairedSeconds = (performance.now() - passStarted) / 1000;
    }
    return allRepairedSeconds !== null && (await repairWorkflows('Completed')) >= 2 * total;
  });
  const load = loadavg();
  const { rows: left } = await sql<{ n: string }>`
    SELECT count(*) AS n FROM allocations a WHERE a.reservation_id = ANY(${ids.cordoned}::text[])
      AND a.superseded_at IS NULL AND a.node_id = ANY(${cordoned}::text[])`.execute(bench.db);
  const failed = await repairWorkflows('Failed');

  console.log(
    `${nodeCount} nodes, ${cordonCount} cordoned; ${affected} of ${total} reservations booked on them`,
  );
  console.log(
    `baseline: ${total} BookingRepairs finding nothing to repair, all done in ${baselineSeconds.toFixed(1)} s (${(total / baselineSeconds).toFixed(0)}/s)`,
  );
  console.log(
    `cordoned: all ${affected} repaired ${(allRepairedSeconds ?? Number.NaN).toFixed(1)} s after the wake-up; all ${total} repair workflows done in ${cordonedSeconds.toFixed(1)} s (${(total / cordonedSeconds).toFixed(0)}/s)`,
  );
  console.log(
    `ratio to the baseline: ${(cordonedSeconds / baselineSeconds).toFixed(2)}; bookings left on cordoned nodes: ${left[0]!.n}; failed repair workflows: ${failed}`,
  );
  console.log(
    `load average: ${load.map((l) => l.toFixed(2)).join(' ')} (1, 5, 15 min; ${baselineLoad.toFixed(2)} after the baseline)`,
  );
} finally {
  await worker.stop();
  await temporal.close();
  await stopTemporal?.();
  await bench.dispose();
}
