/**
 * Placements per second through HTTP: 10,000 simulated nodes (80,000 GPUs) registered in the
 * database, the API served on a real port, and 50 concurrent clients each creating reservations
 * (`reservations.create`, 4 GPUs in one NVLink domain, a fresh idempotency key per call) from ten
 * tenants. Every create goes the whole admission path: authentication (cached), the tenant
 * pre-check, the draft transaction, one IAM decision, the placement transaction with quota, outbox
 * and audit. No lifecycle workflows are started (admission never waits on Temporal).
 * Usage: node --import tsx bench/placement.ts [--seconds 20] [--nodes 10000] [--clients 50]
 *        [--warm-up-seconds 3] (placements not counted, then ANALYZE: see warmUpStatistics)
 */
import { parseArgs } from 'node:util';
import { createLogger } from '../core/logger.ts';
import { checkBookingInvariants } from '../db/allocations/invariants.ts';
import { registerReadyNodes } from '../db/nodes/fleet.ts';
import {
  benchDatabase,
  cpuMeter,
  insertBenchPool,
  postmasterPidOf,
  runLoad,
  startPlacementApi,
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
  },
});
const seconds = Number(values.seconds);
const nodeCount = Number(values.nodes);
const clients = Number(values.clients);
const gpus = Number(values.gpus);

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

  const api = await startPlacementApi(bench.db, { poolId, quotaGpus: nodeCount * 8, log });
  await warmUpStatistics(bench.pool, Number(values['warm-up-seconds']), (s) =>
    runLoad(clients, s, (worker) => api.place(worker, { gpus, duration: '8h' })),
  );
  const postmasterPid = await postmasterPidOf(bench.pool);
  const meter = cpuMeter(postmasterPid);
  const result = await runLoad(clients, seconds, (worker) => api.place(worker, { gpus, duration: '8h' }));
  const used = meter(result.committed);
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
