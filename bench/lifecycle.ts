/**
 * 1,000 live reservation lifecycles on the Temporal dev server: what they cost the worker (memory,
 * CPU), and what starting the workflow after admission's commit adds to `reservations.create`
 * (p50, p99), measured on `creates` API calls, half of them starting the workflow after the commit
 * and half not, interleaved. The rest of the reservations are written in bulk as admission leaves
 * them (placed, a day ahead, so every workflow stays live, waiting on its timers) and started 25
 * at a time. The worker runs in a child process so its figures are its own.
 * Usage: node --import tsx bench/lifecycle.ts [--reservations 1000] [--creates 200] [--idle 5]
 *   [--cache N] (the worker's sticky cache size; default the worker's, 250)
 *   [--wakes N] (then N rounds in which every live lifecycle is woken once, 25 at a time, by the
 *   `extended` update, which answers after the workflow looked at its reservation again: what a
 *   small cache costs when evicted lifecycles wake and replay their history)
 */
import { fork } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';
import { sql } from 'kysely';
import { parseConfig } from '../core/config.ts';
import type { ReservationLifecycle } from '../core/deps.ts';
import { createLogger } from '../core/logger.ts';
import { offerPool, registerReadyNodes } from '../db/nodes/fleet.ts';
import { bootstrapPlatform } from '../iam/bootstrap.ts';
import { createEmbeddedIam } from '../iam/embedded/index.ts';
import { createCompute } from '../server/compute.ts';
import { connectTemporal } from '../temporal/client.ts';
import { createTemporalLifecycle } from '../temporal/lifecycle.ts';
import {
  benchDatabase,
  benchTemporal,
  cpuProfileArgs,
  insertBenchPool,
  percentile,
  processCpuSeconds,
} from './support.ts';

const { values } = parseArgs({
  options: {
    reservations: { type: 'string', default: '1000' },
    creates: { type: 'string', default: '200' },
    idle: { type: 'string', default: '5' },
    cache: { type: 'string' },
    wakes: { type: 'string', default: '0' },
  },
});
const total = Number(values.reservations);
const half = Math.floor(Number(values.creates) / 2);
const log = createLogger({ level: 'warn', name: 'bench' });
const mib = (bytes: number) => (bytes / 1024 / 1024).toFixed(1);

const bench = await benchDatabase('lifecycle', { max: 16 });
const { address, stop: stopTemporal, pid: temporalPid } = await benchTemporal(log);
const taskQueue = `bench-lifecycle-${randomBytes(4).toString('hex')}`;
const temporal = await connectTemporal({ address });
const child = fork(
  fileURLToPath(new URL('./lifecycle-worker.ts', import.meta.url)),
  [
    JSON.stringify({
      databaseUrl: bench.url,
      address,
      taskQueue,
      ...(values.cache !== undefined ? { maxCachedWorkflows: Number(values.cache) } : {}),
    }),
  ],
  {
    // Profiled with this process (`node --cpu-prof --cpu-prof-dir D`): the worker's profile beside it.
    execArgv: [...cpuProfileArgs(process.execArgv), '--import', 'tsx', '--expose-gc'],
    stdio: ['ignore', 'inherit', 'inherit', 'ipc'],
  },
);
type Usage = { memory: NodeJS.MemoryUsage; cpu: NodeJS.CpuUsage };
const next = () => new Promise<Usage>((resolve) => child.once('message', (m) => resolve(m as Usage)));
const sample = async () => {
  const answer = next();
  child.send({ type: 'sample' });
  return answer;
};

try {
  await new Promise((resolve) => child.once('message', resolve));
  const iam = createEmbeddedIam({ db: bench.db, log });
  await bootstrapPlatform(iam);
  await iam.admin.createTenant({ id: 'acme', name: 'acme' });
  const identity = await iam.admin.createIdentity({ tenantId: 'acme', kind: 'service', name: 'bench' });
  await iam.admin.bindRole({ identityId: identity.id, role: 'member' });
  const credential = { token: (await iam.admin.createToken({ identityId: identity.id })).token };
  const { siteId, poolId } = await insertBenchPool(bench.db);
  await registerReadyNodes(bench.db, { siteId, poolId, count: Math.ceil(total / 8) + 1 });
  await offerPool(bench.db, { poolId, tenantId: 'acme', quota: { gpu: total + 8 } });

  const lifecycle = createTemporalLifecycle(temporal.client, { taskQueue });
  const config = parseConfig({});
  const base = { config, db: bench.db, log, iam };
  const withStart = createCompute({ ...base, lifecycle, temporal: temporal.client });
  const withoutStart = createCompute(base);
  const start = Date.now() + 86_400_000;

  const idle = await sample();
  const temporalCpu = () => (temporalPid === null ? null : processCpuSeconds(temporalPid));
  const temporalIdle = temporalCpu();
  const create = async (compute: typeof withStart, i: number) => {
    const t0 = performance.now();
    const r = await compute.api.reservations.create(credential, {
      tenantId: 'acme',
      poolId,
      devices: [{ class: 'gpu', count: 1 }],
      duration: '1h',
      start,
      idempotencyKey: `bench-${i}`,
    });
    return { ms: performance.now() - t0, r };
  };
  // Interleaved, so both variants see the same database and machine load.
  const withMs: number[] = [];
  const withoutMs: number[] = [];
  const unstarted: Array<{ id: string; tenantId: string; poolId: string; state: string }> = [];
  const t0 = performance.now();
  for (let i = 0; i < half; i++) {
    withMs.push((await create(withStart, 2 * i)).ms);
    const { ms, r } = await create(withoutStart, 2 * i + 1);
    withoutMs.push(ms);
    unstarted.push({ id: r.id, tenantId: 'acme', poolId, state: r.state });
  }
  const createSeconds = (performance.now() - t0) / 1000;
  // The rest, written in bulk as admission's second transaction leaves them (placed, one GPU).
  const bulk = total - 2 * half;
  const { rows: bulkRows } = await sql<{ id: string }>`
    WITH r AS (
      INSERT INTO reservations (id, tenant_id, pool_id, owner_identity_id, idempotency_key, request, request_hash,
                                state, duration_ms, during, lifecycle_started_at)
      SELECT 'rsv_bulk' || g, 'acme', ${poolId}, 'idn_bench', 'bulk-' || g,
             ${JSON.stringify({ poolId, devices: [{ class: 'gpu', count: 1, topology: 'any' }], duration: '3600000ms', durationMs: 3_600_000, binding: 'hold' })}::jsonb,
             'bench', 'placed', 3600000,
             tstzrange(compute_now() + interval '1 day', compute_now() + interval '1 day 1 hour', '[)'), NULL
      FROM generate_series(1, ${bulk}) AS g
      RETURNING id, during)
    INSERT INTO allocations (id, reservation_id, node_id, state, during)
    SELECT 'alloc_' || r.id, r.id, (SELECT id FROM nodes ORDER BY id LIMIT 1), 'planned', r.during FROM r
    RETURNING reservation_id AS id`.execute(bench.db);
  for (const r of bulkRows) unstarted.push({ id: r.id, tenantId: 'acme', poolId, state: 'placed' });
  const t1 = performance.now();
  for (let i = 0; i < unstarted.length; i += 25) {
    await Promise.all(unstarted.slice(i, i + 25).map((r) => (lifecycle as ReservationLifecycle).start(r)));
  }
  const startSeconds = (performance.now() - t1) / 1000;

  // Wait until every workflow has looked at its reservation once (lifecycle_started_at).
  const t2 = performance.now();
  for (;;) {
    const row = await bench.db
      .selectFrom('reservations')
      .where('lifecycle_started_at', 'is not', null)
      .select((eb) => eb.fn.countAll<string>().as('n'))
      .executeTakeFirstOrThrow();
    if (Number(row.n) >= total) break;
    if (performance.now() - t2 > 120_000) throw new Error(`only ${row.n} lifecycles started`);
    await new Promise((r) => setTimeout(r, 250));
  }
  const settledSeconds = (performance.now() - t2) / 1000;
  const live = await sample();
  const temporalLive = temporalCpu();
  await new Promise((r) => setTimeout(r, Number(values.idle) * 1000));
  const later = await sample();

  // Wake rounds: every lifecycle woken once a round; with a cache smaller than the live set most
  // of them were evicted and replay their history first.
  const wakeMs: number[] = [];
  const beforeWakes = await sample();
  const t3 = performance.now();
  const end = start + 3_600_000;
  for (let round = 0; round < Number(values.wakes); round++) {
    for (let i = 0; i < unstarted.length; i += 25) {
      await Promise.all(
        unstarted.slice(i, i + 25).map(async (r) => {
          const w0 = performance.now();
          await (lifecycle as ReservationLifecycle).signal(r.id, { type: 'extended', end });
          wakeMs.push(performance.now() - w0);
        }),
      );
    }
  }
  const wakeSeconds = (performance.now() - t3) / 1000;
  const afterWakes = await sample();

  withMs.sort((a, b) => a - b);
  withoutMs.sort((a, b) => a - b);
  const cpu = (a: Usage, b: Usage) => (b.cpu.user + b.cpu.system - a.cpu.user - a.cpu.system) / 1e6;
  console.log(
    `${2 * half} reservations created through the API in ${createSeconds.toFixed(1)} s (sequential, interleaved), ${bulk} written in bulk`,
  );
  console.log(
    `create with the workflow start:    p50 ${percentile(withMs, 50).toFixed(1)} ms, p99 ${percentile(withMs, 99).toFixed(1)} ms`,
  );
  console.log(
    `create without the workflow start: p50 ${percentile(withoutMs, 50).toFixed(1)} ms, p99 ${percentile(withoutMs, 99).toFixed(1)} ms`,
  );
  console.log(
    `${unstarted.length} starts afterwards, 25 at a time: ${(unstarted.length / startSeconds).toFixed(0)} starts/s`,
  );
  console.log(
    `every lifecycle had looked at its reservation ${settledSeconds.toFixed(1)} s after the last start ` +
      `(${(total / (startSeconds + settledSeconds)).toFixed(0)} lifecycles started and looked a second)`,
  );
  const perLifecycleMs = (seconds: number) => ((seconds * 1000) / total).toFixed(1);
  console.log(
    `CPU a lifecycle until its first look: worker ${perLifecycleMs(cpu(idle, live))} ms, Temporal server ${
      temporalIdle === null || temporalLive === null
        ? 'not measured (TEMPORAL_ADDRESS)'
        : `${perLifecycleMs(temporalLive - temporalIdle)} ms`
    }`,
  );
  console.log(
    `worker RSS ${mib(idle.memory.rss)} → ${mib(live.memory.rss)} MiB, heap ${mib(idle.memory.heapUsed)} → ${mib(live.memory.heapUsed)} MiB with ${total} live workflows (${((live.memory.heapUsed - idle.memory.heapUsed) / total / 1024).toFixed(1)} KiB heap, ${((live.memory.rss - idle.memory.rss) / total / 1024).toFixed(0)} KiB RSS each)`,
  );
  console.log(
    `worker CPU: ${cpu(idle, live).toFixed(1)} s while they started, ${cpu(live, later).toFixed(2)} s over ${values.idle} s idle with ${total} live`,
  );
  if (wakeMs.length > 0) {
    wakeMs.sort((a, b) => a - b);
    console.log(
      `${wakeMs.length} wakes (${values.wakes} rounds of ${unstarted.length}, 25 at a time): ${(wakeMs.length / wakeSeconds).toFixed(0)}/s, p50 ${percentile(wakeMs, 50).toFixed(1)} ms, p99 ${percentile(wakeMs, 99).toFixed(1)} ms, worker CPU ${((cpu(beforeWakes, afterWakes) * 1000) / wakeMs.length).toFixed(2)} ms a wake, worker RSS after ${mib(afterWakes.memory.rss)} MiB`,
    );
  }
} finally {
  child.send({ type: 'stop' });
  await new Promise((resolve) => child.once('exit', resolve));
  await temporal.close();
  await stopTemporal?.();
  await bench.dispose();
}
