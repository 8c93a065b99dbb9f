/**
 * Placements per second through HTTP: 10,000 simulated nodes (80,000 GPUs) registered in the
 * database, the API served on a real port, and 50 concurrent clients each creating reservations
 * (`reservations.create`, 4 GPUs in one NVLink domain, a fresh idempotency key per call) from ten
 * tenants. Every create goes the whole admission path: authentication (cached), the tenant
 * pre-check, the draft transaction, one IAM decision, the placement transaction with quota, outbox
 * and audit. No lifecycle workflows are started (admission never waits on Temporal).
 * With `--placer pool-lease` the pool's policy chooses the pool-lease placer after the warm-up, its
 * placing loop (temporal/pool-placer.ts) runs in a process of its own as in a worker
 * (bench/placer-child.ts; `--placer-process same` runs it in this process, beside the API), and
 * every create waits for its batch (`wait`): the same figures, for P2 of bench/scale.ts alone (to
 * profile it). The CPU figures count the placer's process with this one.
 * Usage: node --import tsx bench/placement.ts [--seconds 20] [--nodes 10000] [--clients 50]
 *        [--warm-up-seconds 3] (placements not counted, then ANALYZE: see warmUpStatistics)
 *        [--placer inline|pool-lease] [--batch-size 64] (the pool's poolLease.batchSize)
 *        [--placer-process child|same]
 */
import { parseArgs } from 'node:util';
import { createAdmissionCaches } from '../core/admission-caches.ts';
import { createLogger } from '../core/logger.ts';
import { checkBookingInvariants } from '../db/allocations/invariants.ts';
import { registerReadyNodes } from '../db/nodes/fleet.ts';
import { startPoolPlacer } from '../temporal/pool-placer.ts';
import {
  benchDatabase,
  cpuMeter,
  insertBenchPool,
  noLifecycle,
  postmasterPidOf,
  runLoad,
  startPlacementApi,
  startPlacerInChild,
  usePlacer,
  warmUpStatistics,
} from './support.ts';

const { values } = parseArgs({
  options: {
    seconds: { type: 'string', default: '20' },
    nodes: { type: 'string', default: '10000' },
    clients: { type: 'string', default: '50' },
    gpus: { type: 'string', default: '4' },
    connections: { type: 'string', default: '20' },
    'warm-up-seconds': { type: 'string', default: '3' },
    placer: { type: 'string', default: 'inline' },
    'batch-size': { type: 'string', default: '64' },
    'placer-process': { type: 'string', default: 'child' },
  },
});
const seconds = Number(values.seconds);
const nodeCount = Number(values.nodes);
const clients = Number(values.clients);
const gpus = Number(values.gpus);
if (values.placer !== 'inline' && values.placer !== 'pool-lease') {
  throw new Error(`--placer ${values.placer}: use inline or pool-lease`);
}
const poolLease = values.placer === 'pool-lease';
if (values['placer-process'] !== 'child' && values['placer-process'] !== 'same') {
  throw new Error(`--placer-process ${values['placer-process']}: use child or same`);
}

const bench = await benchDatabase('placement', { max: Number(values.connections) });

const log = createLogger({ level: 'warn', name: 'bench' });
try {
  const t0 = performance.now();
  const { siteId, poolId } = await insertBenchPool(bench.db);
  await registerReadyNodes(bench.db, { siteId, poolId, count: nodeCount });
  await bench.pool.query('VACUUM ANALYZE');
  console.log(
    `loaded ${nodeCount} nodes (${nodeCount * 8} GPUs) in ${((performance.now() - t0) / 1000).toFixed(1)} s`,
  );

  const shape = { gpus, duration: '8h', ...(poolLease ? { waitMs: 30_000 } : {}) };
  // The pool-lease placer from the start, the warm-up included (its statements' plans, too).
  if (poolLease) {
    await usePlacer(bench.db, poolId, 'pool-lease', { batchSize: Number(values['batch-size']) });
  }
  const api = await startPlacementApi(bench.db, { poolId, quotaGpus: nodeCount * 8, log });
  const placerHere =
    poolLease && values['placer-process'] === 'same'
      ? startPoolPlacer(
          { db: bench.db, log, lifecycle: noLifecycle, caches: createAdmissionCaches() },
          { pollMs: 1_000 },
        )
      : undefined;
  const placerChild =
    poolLease && values['placer-process'] === 'child'
      ? await startPlacerInChild({ url: bench.url })
      : undefined;
  await warmUpStatistics(bench.pool, Number(values['warm-up-seconds']), (s) =>
    runLoad(clients, s, (worker) => api.place(worker, shape)),
  );
  const postmasterPid = await postmasterPidOf(bench.pool);
  const meter = cpuMeter(postmasterPid, { alsoNodePids: placerChild ? [placerChild.pid] : [] });
  const batchesBefore = (await placerChild?.batches()) ?? placerHere?.batches ?? 0;
  const result = await runLoad(clients, seconds, (worker) => api.place(worker, shape));
  const used = meter(result.committed);
  const batches = ((await placerChild?.stop()) ?? placerHere?.batches ?? 0) - batchesBefore;
  await placerHere?.stop();
  await api.stop();
  const cpu = {
    nodeSeconds: Number(used.nodeSeconds.toFixed(1)),
    postgresSeconds: Number(used.postgresSeconds.toFixed(1)),
  };
  const perCpuSecond = Math.round(result.committed / Math.max(0.1, cpu.nodeSeconds + cpu.postgresSeconds));
  const invariants = await checkBookingInvariants(bench.db);
  console.log(
    JSON.stringify({
      nodes: nodeCount,
      gpus: nodeCount * 8,
      clients,
      gpusPerReservation: gpus,
      placer: values.placer,
      ...(poolLease ? { placerProcess: values['placer-process'], batches } : {}),
      placements: result.committed,
      pending: result.refused,
      errors: result.errors,
      seconds: result.seconds,
      placementsPerSecond: result.perSecond,
      placementsPerCpuSecond: perCpuSecond,
      cpu,
      p50Ms: result.p50Ms,
      p99Ms: result.p99Ms,
      invariants,
      rootAdminToken: api.rootAdminToken ? 'minted' : 'none',
    }),
  );
} finally {
  await bench.dispose();
}
