/**
 * Creates against a full pool: 10,000 simulated nodes (80,000 GPUs) filled through HTTP by
 * 50 clients creating whole-node reservations (8 GPUs, 8 hours) until creates come back pending,
 * then the same clients creating for `--seconds` more, every one of which the pool can only
 * answer with a NoFit and its counter-offer (the earliest start within 14 days). Reports the
 * answers a second, their p50/p99 through HTTP and the CPU (Node + PostgreSQL) each took,
 * beside the fill's placements a second measured in the same run.
 * Usage: node --import tsx bench/full-pool.ts [--nodes 10000] [--clients 50] [--seconds 15]
 */
import { parseArgs } from 'node:util';
import { createLogger } from '../core/logger.ts';
import { registerReadyNodes } from '../db/nodes/fleet.ts';
import {
  benchDatabase,
  cpuMeter,
  insertBenchPool,
  postmasterPidOf,
  runLoad,
  startPlacementApi,
} from './support.ts';

const { values } = parseArgs({
  options: {
    nodes: { type: 'string', default: '10000' },
    clients: { type: 'string', default: '50' },
    seconds: { type: 'string', default: '15' },
    connections: { type: 'string', default: '20' },
  },
});
const nodeCount = Number(values.nodes);
const clients = Number(values.clients);
const seconds = Number(values.seconds);

const bench = await benchDatabase('full-pool', { max: Number(values.connections) });
const log = createLogger({ level: 'warn', name: 'bench' });
const started = performance.now();
const progress = (line: string) =>
  console.log(`[${((performance.now() - started) / 1000).toFixed(0)} s] ${line}`);
try {
  const { siteId, poolId } = await insertBenchPool(bench.db);
  await registerReadyNodes(bench.db, { siteId, poolId, count: nodeCount });
  await bench.pool.query('VACUUM ANALYZE');
  progress(`loaded ${nodeCount} nodes (${nodeCount * 8} GPUs)`);
  const api = await startPlacementApi(bench.db, { poolId, quotaGpus: nodeCount * 8, log });
  const create = (client: number) => api.place(client, { gpus: 8, duration: '8h' });

  // Fill: 5-s rounds until one comes back with creates pending (the pool has no whole node left).
  let placed = 0;
  let fillSeconds = 0;
  for (let round = 0; round < 200; round++) {
    const fill = await runLoad(clients, 5, create);
    placed += fill.committed;
    fillSeconds += fill.seconds;
    // As autovacuum would over the hours a real fleet takes to fill: the planner's row counts
    // from when the tables were empty make the whole-pool read take minutes (a nested scan of
    // every booking a node).
    await bench.pool.query('ANALYZE');
    progress(`fill: ${placed} placed, ${fill.perSecond}/s, ${fill.refused} pending in the last 5 s`);
    if (fill.refused > 0) break;
  }
  const postmasterPid = await postmasterPidOf(bench.pool);
  const meter = cpuMeter(postmasterPid);
  const full = await runLoad(clients, seconds, create);
  const answers = full.committed + full.refused;
  // Per answer, placed or not: a full pool's creates mostly answer pending.
  const cpuMs = meter(answers).msPerPlacement ?? 0;
  await api.stop();
  progress(
    `full: ${Math.round(answers / full.seconds)} answers/s (${full.refused} pending, ${full.committed} placed, ` +
      `errors ${JSON.stringify(full.errors)}), p50 ${full.p50Ms} ms, p99 ${full.p99Ms} ms, CPU ${cpuMs.toFixed(2)} ms an answer`,
  );
  console.log(
    JSON.stringify({
      nodes: nodeCount,
      clients,
      fillPlaced: placed,
      fillPerSecond: Math.round(placed / fillSeconds),
      fullAnswersPerSecond: Math.round(answers / full.seconds),
      fullPending: full.refused,
      fullPlaced: full.committed,
      fullErrors: full.errors,
      fullP50Ms: full.p50Ms,
      fullP99Ms: full.p99Ms,
      fullCpuMsPerAnswer: Number(cpuMs.toFixed(2)),
    }),
  );
} finally {
  await bench.dispose();
}
