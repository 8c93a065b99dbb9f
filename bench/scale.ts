/**
 * Placement at fleet scale in one run (issue 14), every figure a ratio to this machine's own
 * guarded booking rate measured in the same run (machines here differ by 2 to 3 times):
 *   B   guarded bookings/s at 8 connections, alternating with the unguarded load (a bare copy of
 *       the table) and the keyed load (a copy with its primary and foreign keys) in
 *       `--booking-slices` slices (bench/bookings.ts's load: per-device locks in order,
 *       the EXCLUDE constraint), and both other rates beside it (their ratios to it: what the
 *       guarded insert costs over a bare insert, and what the guard alone costs over the keys);
 *   P1  inline placements/s through HTTP (bench/placement.ts's load: `reservations.create` of 4
 *       GPUs in one NVLink domain by `--clients` clients of ten tenants, sent from a process of
 *       their own, bench/load-child.ts), with the CPU per placement of the control plane: this
 *       process (API and admission) plus PostgreSQL's processes; the load generator's CPU per
 *       create is reported apart (`loadGeneratorCpuMsPerCreate`);
 *   P2  pool-lease placements/s through HTTP at the same fleet, emptied of the parts before (the
 *       pool's policy switched to `placer: 'pool-lease'`, the placing loop of temporal/pool-placer.ts in a
 *       process of its own as in a worker, bench/placer-child.ts, its CPU counted with the API's), each
 *       `create` with `wait` answering once its batch committed, the clients again in a process of
 *       their own), with its CPU per placement;
 *   overlaps after the run (two bookings of one device overlapping; must be 0);
 *   sequential latency (`--sequential N`, on by default: 200): one client creating inline, one
 *       create after the other, p50/p99 through HTTP;
 *   open-loop latency (`--open-loop-seconds S`, on by default: 10): creates arriving at a fixed
 *       rate, half of P1 (inline `create`) and then half of P2 (pool-lease `create` with `wait`),
 *       each issued on schedule whether or not earlier ones answered, p50/p99 from the scheduled
 *       time;
 *   live reservations (`--live N`, off by default: its bulk write takes a minute or more): the
 *       inline and pool-lease rates with N live 1-GPU reservations over the rates with none,
 *       measured on a second pool of the same shape that holds them (bench/support.ts's
 *       insertLiveReservations) and on the first, emptied of the loads before, in `--live-slices`
 *       alternating slice pairs of `--live-seconds` / slices each (bench/live-ratio.ts);
 *   the lifecycle start backlog (`--lifecycle-seconds S`, off by default: it starts a Temporal dev
 *       server, unless TEMPORAL_ADDRESS is set, and a worker in a child process): a P1-like load
 *       whose creates start real lifecycles, sampling every 500 ms how many placed reservations
 *       have no started workflow yet;
 *   with `--commands N`, command p50/p99 at the node count: bench/gateway.ts run as a child
 *       (`--provision direct`: N simulated agents in one process, `diag.nvml` at `--command-rate`).
 * Before P1, `--warm-up-seconds` of P1's load (not counted) and ANALYZE give the tables the
 * statistics of a fleet in service (bench/support.ts, warmUpStatistics); before P2 the same with
 * P2's load, once its placer runs (its caches and its statements' plans made before it counts).
 * Progress lines while it runs; the last line is one JSON object.
 * Usage: node --import tsx bench/scale.ts [--nodes 10000] [--clients 50] [--seconds 15]
 *        [--booking-seconds 10] [--booking-slices 5] [--gpus 4] [--connections 20] [--commands 0] [--command-rate 50]
 *        [--sequential 200] [--open-loop-seconds 10] [--live 0] [--live-seconds 15] [--live-slices 3]
 *        [--lifecycle-seconds 0] [--warm-up-seconds 3]   (0 turns a part off)
 */
import { spawn } from 'node:child_process';
import { loadavg } from 'node:os';
import { parseArgs } from 'node:util';
import { sql } from 'kysely';
import { createLogger } from '../core/logger.ts';
import { checkBookingInvariants } from '../db/allocations/invariants.ts';
import { registerReadyNodes } from '../db/nodes/fleet.ts';
import { type LifecycleBacklog, measureLifecycleBacklog } from './lifecycle-backlog.ts';
import { type LiveRatio, measureLiveRatio } from './live-ratio.ts';
import {
  benchDatabase,
  cpuMeter,
  endPlacedReservations,
  insertBenchPool,
  type LoadResult,
  type OpenLoopResult,
  postmasterPidOf,
  prepareBookingLoad,
  runLoad,
  runOpenLoop,
  startPlacementApi,
  startPlacerInChild,
  usePlacer,
  warmUpStatistics,
} from './support.ts';

const { values } = parseArgs({
  options: {
    nodes: { type: 'string', default: '10000' },
    clients: { type: 'string', default: '50' },
    seconds: { type: 'string', default: '15' },
    'booking-seconds': { type: 'string', default: '10' },
    'booking-slices': { type: 'string', default: '5' },
    gpus: { type: 'string', default: '4' },
    connections: { type: 'string', default: '20' },
    commands: { type: 'string', default: '0' },
    'command-rate': { type: 'string', default: '50' },
    sequential: { type: 'string', default: '200' },
    'open-loop-seconds': { type: 'string', default: '10' },
    live: { type: 'string', default: '0' },
    'live-seconds': { type: 'string' },
    'live-slices': { type: 'string', default: '3' },
    'lifecycle-seconds': { type: 'string', default: '0' },
    'warm-up-seconds': { type: 'string', default: '3' },
  },
});
const nodeCount = Number(values.nodes);
const clients = Number(values.clients);
const seconds = Number(values.seconds);
const bookingSeconds = Number(values['booking-seconds']);
const bookingSlices = Math.max(1, Number(values['booking-slices']));
const gpus = Number(values.gpus);
const commandCount = Number(values.commands);
const sequentialCount = Number(values.sequential);
const openLoopSeconds = Number(values['open-loop-seconds']);
const liveCount = Number(values.live);
const liveSeconds = Number(values['live-seconds'] ?? values.seconds);
const liveSlices = Math.max(1, Number(values['live-slices']));
const lifecycleSeconds = Number(values['lifecycle-seconds']);
const warmUpSeconds = Number(values['warm-up-seconds']);

const started = performance.now();
const load = () =>
  loadavg()
    .map((l) => l.toFixed(2))
    .join(' ');
const progress = (line: string) =>
  console.log(`[${((performance.now() - started) / 1000).toFixed(0)} s] ${line} (load average ${load()})`);
const describeOpenLoop = (r: OpenLoopResult) =>
  `${r.issued} issued at ${r.ratePerSecond}/s, ${r.committed} placed, ${r.refused} not placed, ` +
  `errors ${JSON.stringify(r.errors)}, ${r.unanswered} unanswered; p50 ${r.p50Ms} ms, p99 ${r.p99Ms} ms; ` +
  `this process's event-loop delay p99 ${r.loopDelayP99Ms} ms, max ${r.loopDelayMaxMs} ms; ` +
  `worst second ${JSON.stringify(r.worstSecond)}; p99 by second ${r.p99BySecond.join(', ')} ms`;
const pickOpenLoop = (r: OpenLoopResult) => ({
  ratePerSecond: r.ratePerSecond,
  p50Ms: r.p50Ms,
  p99Ms: r.p99Ms,
  loopDelayP99Ms: r.loopDelayP99Ms,
  loopDelayMaxMs: r.loopDelayMaxMs,
  worstSecond: r.worstSecond,
  p99BySecond: r.p99BySecond,
  issued: r.issued,
  placed: r.committed,
  errors: r.errors,
  unanswered: r.unanswered,
});
/** The load generator's CPU per create it sent (placed or not), in ms. */
const perRequestMs = (r: LoadResult & { loadGeneratorCpuSeconds: number }) =>
  Number(((r.loadGeneratorCpuSeconds * 1000) / Math.max(1, r.committed + r.refused)).toFixed(2));
const ratio = (a: number | null, b: number) => (a === null || b === 0 ? null : Number((a / b).toFixed(3)));
/** Slices of one load as one: their counts and seconds summed, the median slice's p50 and p99. */
const mergeSlices = (slices: readonly LoadResult[]): LoadResult => {
  const median = (pick: (r: LoadResult) => number) =>
    slices.map(pick).sort((a, b) => a - b)[Math.floor(slices.length / 2)]!;
  const committed = slices.reduce((sum, r) => sum + r.committed, 0);
  const secondsTotal = slices.reduce((sum, r) => sum + r.seconds, 0);
  const errors: Record<string, number> = {};
  for (const r of slices) for (const [k, n] of Object.entries(r.errors)) errors[k] = (errors[k] ?? 0) + n;
  return {
    committed,
    refused: slices.reduce((sum, r) => sum + r.refused, 0),
    errors,
    seconds: secondsTotal,
    perSecond: Math.round(committed / secondsTotal),
    p50Ms: median((r) => r.p50Ms),
    p99Ms: median((r) => r.p99Ms),
  };
};

/** bench/gateway.ts as a child at this node count: its last line's command latency. */
async function commandLatency(): Promise<{ p50Ms: number; p99Ms: number; completed: number } | null> {
  const child = spawn(
    process.execPath,
    [
      '--expose-gc',
      '--import',
      'tsx',
      'bench/gateway.ts',
      '--nodes',
      String(nodeCount),
      '--provision',
      'direct',
      '--idle-seconds',
      '1',
      '--commands',
      String(commandCount),
      '--rate',
      values['command-rate'],
    ],
    { stdio: ['ignore', 'pipe', 'inherit'] },
  );
  let last = '';
  child.stdout.setEncoding('utf8');
  child.stdout.on('data', (chunk: string) => {
    for (const line of chunk.split('\n').filter(Boolean)) {
      if (line.startsWith('{')) last = line;
      else console.log(`  gateway: ${line}`);
    }
  });
  const code = await new Promise<number | null>((resolve) => child.on('exit', resolve));
  if (code !== 0 || !last) return null;
  return (JSON.parse(last) as { commands: { p50Ms: number; p99Ms: number; completed: number } }).commands;
}

const bench = await benchDatabase('scale', { max: Math.max(8, Number(values.connections)) });
/**
 * Ends every placed reservation of the parts before, then settles the database: the rows just
 * ended (or written in bulk) vacuumed and analyzed and their pages written out, as in a fleet whose
 * reservations came and went over days (else the next part pays autovacuum, the hint bits of
 * thousands of fresh rows and a checkpoint that the one before did not). Answers how many ended.
 */
/** Ends the placed reservations (see endPlacedReservations' options), then settles. */
const settleEmptied = async (options: Parameters<typeof endPlacedReservations>[1] = {}) => {
  const ended = await endPlacedReservations(bench.db, options);
  await settle();
  return ended;
};
const settle = () => bench.pool.query('VACUUM ANALYZE').then(() => bench.pool.query('CHECKPOINT'));
const log = createLogger({ level: 'warn', name: 'bench-scale' });
const placedCount = async () => {
  const { rows } = await sql<{ n: number }>`
    SELECT count(*)::int AS n FROM reservations WHERE state = 'placed'`.execute(bench.db);
  return rows[0]!.n;
};
try {
  progress(`loading ${nodeCount} nodes (${nodeCount * 8} GPUs)`);
  const { siteId, poolId } = await insertBenchPool(bench.db);
  const nodes = await registerReadyNodes(bench.db, { siteId, poolId, count: nodeCount });
  const deviceIds = nodes.flatMap((n) => n.deviceIds);
  // Enough allocations for every booking attempt of the three loads and their first slices at a
  // generous rate (the keyed copy's foreign key refuses a booking of an allocation not made).
  const bookings = await prepareBookingLoad(bench.db, {
    poolId,
    nodeId: nodes[0]!.id,
    deviceIds,
    count: Math.max(50_000, (bookingSeconds + 1) * 3 * 15_000),
  });
  // Settled as the parts below are: the checkpoint the bulk load would otherwise start in the
  // middle of some slice (slowing whichever load ran then) is taken before the first.
  await settle();
  progress(`loaded ${nodeCount} nodes, ${deviceIds.length} GPUs`);

  // B: the cost of the guarantee itself, which no placement can beat. Guarded and unguarded
  // alternate in slices, so a neighbour's burst (or the tables' growth) weighs on both alike.
  const guardedSlices: LoadResult[] = [];
  const unguardedSlices: LoadResult[] = [];
  const keyedSlices: LoadResult[] = [];
  // One short slice of each first, not counted: the first load after loading the fleet and its
  // VACUUM ANALYZE ran slower whichever it was (its slice's factor 1.6 to 2.1 where the rest
  // measured 1.1 to 1.5), which charged the guard with the machine settling.
  await bookings.guarded(8, 1);
  await bookings.unguarded(8, 1);
  await bookings.keyed(8, 1);
  for (let i = 0; i < bookingSlices; i++) {
    guardedSlices.push(await bookings.guarded(8, bookingSeconds / bookingSlices));
    unguardedSlices.push(await bookings.unguarded(8, bookingSeconds / bookingSlices));
    keyedSlices.push(await bookings.keyed(8, bookingSeconds / bookingSlices));
  }
  const guarded = mergeSlices(guardedSlices);
  const unguarded = mergeSlices(unguardedSlices);
  const keyed = mergeSlices(keyedSlices);
  const sliceFactors = guardedSlices.map((g, i) => ratio(unguardedSlices[i]!.perSecond, g.perSecond));
  const keyedSliceFactors = guardedSlices.map((g, i) => ratio(keyedSlices[i]!.perSecond, g.perSecond));
  progress(`B: guarded bookings at 8 connections: ${guarded.perSecond}/s (p99 ${guarded.p99Ms} ms)`);
  progress(
    `unguarded inserts at 8 connections: ${unguarded.perSecond}/s (p99 ${unguarded.p99Ms} ms); ` +
      `${bookingSlices} alternating slices, cost factor by slice ${sliceFactors.join(', ')}`,
  );
  progress(
    `keyed inserts (primary and foreign keys, no guard) at 8 connections: ${keyed.perSecond}/s ` +
      `(p99 ${keyed.p99Ms} ms); the guard's own cost factor by slice ${keyedSliceFactors.join(', ')}`,
  );
  const bookingOverlaps = (await checkBookingInvariants(bench.db)).deviceOverlaps;
  // The placements below start on an empty pool.
  await bookings.remove();
  await bench.pool.query('VACUUM ANALYZE');

  // P1: inline placements through HTTP.
  const api = await startPlacementApi(bench.db, { poolId, quotaGpus: nodeCount * 8, log });
  progress(`warm-up: ${warmUpSeconds} s of inline placements, then ANALYZE (not measured)`);
  await warmUpStatistics(bench.pool, warmUpSeconds, (s) =>
    api.loadInChild(clients, s, { gpus, duration: '8h' }),
  );
  const postmasterPid = await postmasterPidOf(bench.pool);
  const meterP1 = cpuMeter(postmasterPid);
  const ticker = setInterval(() => progress('P1: inline placements running'), 5_000);
  const inline = await api
    .loadInChild(clients, seconds, { gpus, duration: '8h' })
    .finally(() => clearInterval(ticker));
  const cpu = meterP1(inline.committed);
  const cpuMsPerPlacement = cpu.msPerPlacement;
  progress(
    `P1: ${inline.perSecond} inline placements/s (${inline.committed} placed, ${inline.refused} pending, ` +
      `errors ${JSON.stringify(inline.errors)}), p50 ${inline.p50Ms} ms, p99 ${inline.p99Ms} ms, ` +
      `CPU ${cpuMsPerPlacement} ms per placement (Node ${cpu.nodeSeconds.toFixed(1)} s, ` +
      `PostgreSQL ${postmasterPid ? `${cpu.postgresSeconds.toFixed(1)} s` : 'not readable'}; ` +
      `the load generator apart: ${perRequestMs(inline)} ms per create)`,
  );

  // Sequential latency: one client, one inline create after the other.
  let sequential: LoadResult | null = null;
  if (sequentialCount > 0) {
    progress(`sequential: ${sequentialCount} inline creates by one client`);
    sequential = await runLoad(
      1,
      600,
      (client) => api.place(client, { gpus, duration: '8h' }),
      sequentialCount,
    );
    progress(
      `sequential: p50 ${sequential.p50Ms} ms, p99 ${sequential.p99Ms} ms (${sequential.committed} placed, ` +
        `errors ${JSON.stringify(sequential.errors)})`,
    );
  }
  // Open loop at half of P1: arrivals on schedule, whatever the answers do.
  let openLoopInline: OpenLoopResult | null = null;
  if (openLoopSeconds > 0 && inline.perSecond > 0) {
    const rate = inline.perSecond / 2;
    progress(`open loop: inline creates at ${rate}/s for ${openLoopSeconds} s`);
    openLoopInline = await runOpenLoop(rate, openLoopSeconds, (i) => api.place(i, { gpus, duration: '8h' }));
    progress(`open loop, inline: ${describeOpenLoop(openLoopInline)}`);
  }

  // P2: the same API and fleet, the pool switched to the pool-lease placer (admission's pool
  // cache holds the old policy for up to 5 s), its loop in a process of its own as a worker runs
  // it beside the API in production (its CPU counted with this process's); on the
  // pool emptied of the parts above, as P1 had it (at these rates P1, its open loop and P2 would
  // otherwise fill all 80,000 GPUs, and P2's open loop would measure a full pool's NoFit path).
  const endedBeforeP2 = await settleEmptied();
  progress(`P2: ${endedBeforeP2} placed reservations of the parts above ended`);
  await usePlacer(bench.db, poolId, 'pool-lease');
  // wall time: outliving admission's pool cache (a bench pause, not a decision)
  await new Promise((resolve) => setTimeout(resolve, 5_500));
  const placer = await startPlacerInChild({ url: bench.url });
  progress(`warm-up: ${warmUpSeconds} s of pool-lease placements, then ANALYZE (not measured)`);
  await warmUpStatistics(bench.pool, warmUpSeconds, (s) =>
    api.loadInChild(clients, s, { gpus, duration: '8h', waitMs: 30_000 }),
  );
  const batchesBefore = await placer.batches();
  const meterP2 = cpuMeter(postmasterPid, { alsoNodePids: [placer.pid] });
  const ticker2 = setInterval(() => progress('P2: pool-lease placements running'), 5_000);
  const poolLease = await api
    .loadInChild(clients, seconds, { gpus, duration: '8h', waitMs: 30_000 })
    .finally(() => clearInterval(ticker2));
  const poolLeaseCpuMs = meterP2(poolLease.committed).msPerPlacement;
  const batches = (await placer.batches()) - batchesBefore;
  // Open loop at half of P2: create with wait, arrivals on schedule.
  let openLoopPoolLease: OpenLoopResult | null = null;
  if (openLoopSeconds > 0 && poolLease.perSecond > 0) {
    const rate = poolLease.perSecond / 2;
    progress(`open loop: pool-lease creates with wait at ${rate}/s for ${openLoopSeconds} s`);
    openLoopPoolLease = await runOpenLoop(rate, openLoopSeconds, (i) =>
      api.place(i, { gpus, duration: '8h', waitMs: 30_000 }),
    );
    progress(`open loop, pool-lease: ${describeOpenLoop(openLoopPoolLease)}`);
  }
  await placer.stop();
  await api.stop();
  progress(
    `P2: ${poolLease.perSecond} pool-lease placements/s (${poolLease.committed} placed, ${poolLease.refused} ` +
      `not placed, errors ${JSON.stringify(poolLease.errors)}, ${batches} batches), create+wait p50 ` +
      `${poolLease.p50Ms} ms, p99 ${poolLease.p99Ms} ms, CPU ${poolLeaseCpuMs} ms per placement ` +
      `(the load generator apart: ${perRequestMs(poolLease)} ms per create)`,
  );

  // The parts below place inline again: the pool back to its own placer. Each starts an API of its
  // own (fresh admission caches, so nothing waits out the old pool cache).
  await usePlacer(bench.db, poolId, 'inline');

  // Live reservations: the rates on a pool that holds them over the rates on the empty one.
  let liveReservations: LiveRatio | null = null;
  if (liveCount > 0) {
    const endedBefore = await settleEmptied();
    progress(`live: ${endedBefore} placed reservations of the parts above ended`);
    liveReservations = await measureLiveRatio({
      db: bench.db,
      databaseUrl: bench.url,
      log,
      postmasterPid,
      emptyPoolId: poolId,
      nodeCount,
      count: liveCount,
      clients,
      gpus,
      slices: liveSlices,
      sliceSeconds: liveSeconds / liveSlices,
      settle,
      progress,
    });
  }

  let lifecycleBacklog: LifecycleBacklog | null = null;
  if (lifecycleSeconds > 0) {
    lifecycleBacklog = await measureLifecycleBacklog({
      db: bench.db,
      databaseUrl: bench.url,
      poolId,
      quotaGpus: nodeCount * 8,
      clients,
      seconds: lifecycleSeconds,
      gpus,
      log,
      progress,
    });
  }

  const invariants = await checkBookingInvariants(bench.db);
  progress(
    `overlaps after the run: ${invariants.deviceOverlaps}; placed reservations: ${await placedCount()}`,
  );

  let commands: Awaited<ReturnType<typeof commandLatency>> = null;
  if (commandCount > 0) {
    progress(`commands: ${commandCount} at ${values['command-rate']}/s to ${nodeCount} simulated nodes`);
    commands = await commandLatency();
    progress(
      `commands: ${commands ? `p50 ${commands.p50Ms} ms, p99 ${commands.p99Ms} ms` : 'the run failed'}`,
    );
  }

  console.log(
    JSON.stringify({
      nodes: nodeCount,
      gpus: deviceIds.length,
      clients,
      gpusPerReservation: gpus,
      bookingsPerSecond: guarded.perSecond,
      unguardedBookingsPerSecond: unguarded.perSecond,
      // How many times a guarded booking costs an unguarded insert (goal: at most 1.3).
      guardedCostFactor: ratio(unguarded.perSecond, guarded.perSecond),
      guardedCostFactorBySlice: sliceFactors,
      // The same against a copy with the table's keys (primary key, both foreign keys) and
      // without the guard: what the EXCLUDE constraint and the per-device lock cost on their own.
      keyedBookingsPerSecond: keyed.perSecond,
      guardOnlyCostFactor: ratio(keyed.perSecond, guarded.perSecond),
      guardOnlyCostFactorBySlice: keyedSliceFactors,
      inlinePerSecond: inline.perSecond,
      inlineP50Ms: inline.p50Ms,
      inlineP99Ms: inline.p99Ms,
      inlineErrors: inline.errors,
      poolLeasePerSecond: poolLease.perSecond,
      poolLeaseP50Ms: poolLease.p50Ms,
      poolLeaseP99Ms: poolLease.p99Ms,
      poolLeaseErrors: poolLease.errors,
      poolLeaseBatches: batches,
      poolLeaseCpuMsPerPlacement: poolLeaseCpuMs,
      cpuMsPerPlacement,
      cpuSeconds: {
        node: Number(cpu.nodeSeconds.toFixed(2)),
        postgres: postmasterPid ? Number(cpu.postgresSeconds.toFixed(2)) : null,
      },
      loadGeneratorCpuMsPerCreate: { inline: perRequestMs(inline), poolLease: perRequestMs(poolLease) },
      overlaps: invariants.deviceOverlaps + bookingOverlaps,
      scalarOverbookings: invariants.scalarOverbookings,
      ratios: {
        inlineToBookings: ratio(inline.perSecond, guarded.perSecond),
        poolLeaseToBookings: ratio(poolLease.perSecond, guarded.perSecond),
        bookingsPerPlacement: ratio(guarded.perSecond, inline.perSecond),
      },
      goals: { inlineToBookings: 0.1, poolLeaseToBookings: 0.2, cpuMsPerPlacement: 5, overlaps: 0 },
      commands,
      sequentialP50Ms: sequential?.p50Ms ?? null,
      sequentialP99Ms: sequential?.p99Ms ?? null,
      openLoop: {
        inline: openLoopInline && pickOpenLoop(openLoopInline),
        poolLease: openLoopPoolLease && pickOpenLoop(openLoopPoolLease),
      },
      liveReservations,
      lifecycleBacklog,
      loadAverage: load(),
    }),
  );
} finally {
  await bench.dispose();
}
process.exit(0);
