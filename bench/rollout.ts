/**
 * A rollout of a signed bcd release across a simulated fleet. The API runs in this process, beside
 * a private PostgreSQL, the Temporal dev server, a worker in a child process
 * (`bench/lifecycle-worker.ts`, hosting the rollout workflow) and the gateway with mutual TLS in
 * another (`bench/rollout-gateway.ts`); the fleet runs as `bcd sim` agents spread over several child processes
 * (`bench/rollout-fleet.ts`), each agent with its own key, certificate, session, journal and A/B
 * slots, in P pools whose disruption budget is 10% each. It reports:
 *   - the fleet's join time (first spawn until every node is connected and ready);
 *   - the rollout's total time (create to completed) at the given soak;
 *   - the peak nodes updating at once per pool, replayed from the outbox (never above the budget);
 *   - command latency: `diag.nvml` (as bench/gateway.ts; an `inventory.refresh` would make every
 *     probe a full inventory write, about 12 ms of gateway CPU) to random nodes at a steady rate,
 *     from the enqueue's
 *     commit to the result stored (the gateway's completion callback), p50 and p99 before the
 *     rollout and during it, and their ratio;
 *   - the most nodes the liveness sweep had marked unreachable at once (sampled every 2 s).
 * Usage: node --import tsx bench/rollout.ts [--nodes 1000] [--pools 4] [--soak-seconds 2]
 *        [--rate 10] [--fleet-processes 8] [--profile-gateway <dir>]
 */
import { type ChildProcess, fork } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { loadavg, tmpdir } from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';
import { sql } from 'kysely';
import { parseConfig } from '../core/config.ts';
import { createLogger } from '../core/logger.ts';
import { enqueueNodeCommand } from '../db/nodes/commands.ts';
import { insertPool, insertSite } from '../db/nodes/fleet.ts';
import { createJoinToken } from '../db/nodes/join-tokens.ts';
import { generateReleaseSigningKey, releaseFileEntry, signRelease } from '../domain/release-manifest.ts';
import { currentProtocolVersion } from '../domain/release-version.ts';
import { bootstrapPlatform } from '../iam/bootstrap.ts';
import { createEmbeddedIam } from '../iam/embedded/index.ts';
import { createCompute } from '../server/compute.ts';
import { connectTemporal } from '../temporal/client.ts';
import { forkGateway } from './gateway-child.ts';
import { benchDatabase, benchTemporal, percentile } from './support.ts';

const { values } = parseArgs({
  options: {
    nodes: { type: 'string', default: '1000' },
    pools: { type: 'string', default: '4' },
    'soak-seconds': { type: 'string', default: '2' },
    rate: { type: 'string', default: '10' },
    'fleet-processes': { type: 'string', default: '8' },
    /** A directory for the gateway process's CPU profile (node --cpu-prof). */
    'profile-gateway': { type: 'string' },
  },
});
const nodes = Number(values.nodes);
const poolCount = Number(values.pools);
const soakSeconds = Number(values['soak-seconds']);
const rate = Number(values.rate);
const fleetProcesses = Math.max(poolCount, Number(values['fleet-processes']));
const log = createLogger({ level: 'warn', name: 'bench' });
const secret = randomBytes(32).toString('hex');
const signer = generateReleaseSigningKey();
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
const load = () => loadavg().map((l) => Number(l.toFixed(2)));
const here = (file: string) => fileURLToPath(new URL(file, import.meta.url));
const loadBefore = load();
console.error(
  `rollout bench: ${nodes} nodes, ${poolCount} pools, ${fleetProcesses} fleet processes; load ${loadBefore}`,
);

const bench = await benchDatabase('rollout', { max: 30 });
const { address, stop: stopTemporal } = await benchTemporal(log);
const taskQueue = `bench-rollout-${randomBytes(4).toString('hex')}`;
const config = parseConfig({
  BETTER_COMPUTE_SECRET: secret,
  BETTER_COMPUTE_RELEASE_PINS: signer.pin,
  BETTER_COMPUTE_TASK_QUEUE: taskQueue,
  BETTER_COMPUTE_RATE_LIMIT_PER_TOKEN: '0',
  BETTER_COMPUTE_RATE_LIMIT_PER_TENANT: '0',
});
const children: ChildProcess[] = [];
/** A child's next IPC message (the children answer every message with one). */
const nextMessage = <T>(child: ChildProcess) =>
  new Promise<T>((resolve) => child.once('message', (m) => resolve(m as T)));
const worker = fork(
  here('./lifecycle-worker.ts'),
  [JSON.stringify({ databaseUrl: bench.url, address, taskQueue })],
  {
    execArgv: ['--import', 'tsx'],
    stdio: ['ignore', 'inherit', 'inherit', 'ipc'],
  },
);
children.push(worker);
const workerReady = nextMessage(worker);
const temporal = await connectTemporal({ address });
const iam = createEmbeddedIam({ db: bench.db, log });
const platform = await bootstrapPlatform(iam);
const compute = createCompute({ config, db: bench.db, log, iam, temporal: temporal.client });
const root = { token: platform.rootAdminToken };
const enqueuedAt = new Map<string, number>();
const completedAt = new Map<string, number>();
const gatewayChild = forkGateway({
  databaseUrl: bench.url,
  env: {
    BETTER_COMPUTE_SECRET: secret,
    BETTER_COMPUTE_RELEASE_PINS: signer.pin,
    BETTER_COMPUTE_TASK_QUEUE: taskQueue,
  },
  options: {
    heartbeatIntervalMs: 5_000,
    leaseMs: 30_000,
    // Every simulated machine joins from 127.0.0.1: the per-address Join limit (10/s) would be
    // the whole fleet's; the gateway-wide limit (100/s) still applies.
    joinsPerSecondPerPeer: 100,
    joinBurstPerPeer: 200,
  },
  profileDir: values['profile-gateway'],
  onCompleted: (id, atMs) => {
    if (enqueuedAt.has(id)) completedAt.set(id, atMs);
  },
});
const gateway = gatewayChild.child;
children.push(gateway);
const gatewayListening = gatewayChild.listening;
/** The gateway's sessions, CPU seconds and event-loop delay p99 since the last sample. */
const gatewaySample = gatewayChild.sample;
const { address: gatewayAddress, caCertificatePem } = await gatewayListening;
const dir = mkdtempSync(path.join(tmpdir(), 'bc-bench-rollout-'));
const caFile = path.join(dir, 'ca.pem');
writeFileSync(caFile, caCertificatePem);
const siteId = await insertSite(bench.db, { name: 'bench', region: 'eu-central-1' });
const poolIds: string[] = [];
const trust = { pins: [signer.pin], threshold: 1 };
const fleets: ChildProcess[] = [];

/** Nodes by connectivity now; the peak of `unreachable` is kept. */
let peakUnreachable = 0;
async function connectivity(): Promise<Record<string, number>> {
  const { rows } = await sql<{ connectivity: string; ready: boolean; n: string }>`
    SELECT connectivity, provision_state = 'ready' AS ready, count(*) AS n FROM nodes GROUP BY 1, 2`.execute(
    bench.db,
  );
  const out: Record<string, number> = {};
  for (const r of rows) {
    const key = r.connectivity === 'connected' && r.ready ? 'ready' : r.connectivity;
    out[key] = (out[key] ?? 0) + Number(r.n);
  }
  peakUnreachable = Math.max(peakUnreachable, out.unreachable ?? 0);
  return out;
}
/** CPU seconds and event-loop delay p99 of every fleet process since the last sample. */
async function fleetSamples(): Promise<
  Array<{ cpuSeconds: number; loopDelayP99Ms: number; rssMiB: number }>
> {
  return Promise.all(
    fleets.map((child) => {
      const answer = nextMessage<{ cpuSeconds: number; loopDelayP99Ms: number; rssMiB: number }>(child);
      child.send({ type: 'sample' });
      return answer;
    }),
  );
}

interface CommandSample {
  nodeId: string;
  /** When it was enqueued (wall time, to compare with the rollout's node windows). */
  atMs: number;
  ms: number;
}

/** Enqueues `diag.nvml` to random nodes at `rate`/s while `go()`; answers the completed ones. */
async function commandLatencies(
  nodeIds: string[],
  go: () => boolean,
  seconds: number,
): Promise<CommandSample[]> {
  const sent: Array<{ id: string; nodeId: string; atMs: number }> = [];
  const interval = 1000 / rate;
  const start = performance.now();
  for (let i = 0; go() && performance.now() - start < seconds * 1000; i++) {
    const wait = start + i * interval - performance.now();
    if (wait > 0) await sleep(wait);
    const nodeId = nodeIds[Math.floor(Math.random() * nodeIds.length)]!;
    const { id } = await bench.db.transaction().execute((trx) =>
      enqueueNodeCommand(trx, {
        nodeId,
        kind: 'diag.nvml',
        payload: { level: 'quick' },
        notAfterSeconds: 300,
      }),
    );
    // wall time: compared with the gateway process's completion stamps and rollout_nodes' windows
    const atMs = Date.now();
    enqueuedAt.set(id, atMs);
    sent.push({ id, nodeId, atMs });
  }
  // Stragglers: a command to a node restarting into its new slot waits for its new session.
  const deadline = performance.now() + 120_000;
  while (sent.some(({ id }) => !completedAt.has(id)) && performance.now() < deadline) await sleep(200);
  return sent
    .filter(({ id }) => completedAt.has(id))
    .map(({ id, nodeId, atMs }) => ({ nodeId, atMs, ms: completedAt.get(id)! - enqueuedAt.get(id)! }));
}

try {
  await workerReady;
  const started = performance.now();
  const perPool = (p: number) => Math.floor(nodes / poolCount) + (p < nodes % poolCount ? 1 : 0);
  const tokens: string[] = [];
  for (let p = 0; p < poolCount; p++) {
    const poolId = await insertPool(bench.db, {
      siteId,
      ownerTenantId: platform.rootTenantId,
      name: `pool-${p}`,
      gpuModel: 'h100',
      policy: { disruption: { maxUnavailable: '10%', soakSeconds } },
    });
    poolIds.push(poolId);
    tokens.push((await createJoinToken(bench.db, { poolId, ttlSeconds: 3600, maxUses: perPool(p) })).token);
  }
  // Fleet process f serves pool f % P; a pool's nodes are shared among its processes.
  for (let f = 0; f < fleetProcesses; f++) {
    const p = f % poolCount;
    const mine = Array.from({ length: fleetProcesses }, (_, g) => g).filter((g) => g % poolCount === p);
    const share = Math.floor(perPool(p) / mine.length) + (mine.indexOf(f) < perPool(p) % mine.length ? 1 : 0);
    const child = fork(
      here('./rollout-fleet.ts'),
      [
        JSON.stringify({
          gatewayAddress,
          caFile,
          joinToken: tokens[p],
          nodes: share,
          rootDir: path.join(dir, `fleet-${f}`),
          namePrefix: `p${p}f${f}`,
          version: '1.0.0',
          trust,
        }),
      ],
      { execArgv: ['--import', 'tsx'], stdio: ['ignore', 'inherit', 'inherit', 'ipc'] },
    );
    children.push(child);
    fleets.push(child);
  }
  await Promise.all(fleets.map((child) => nextMessage(child)));
  const agentsSeconds = (performance.now() - started) / 1000;
  for (let tick = 0; ; tick++) {
    const now = await connectivity();
    if ((now.ready ?? 0) >= nodes) break;
    if (tick % 30 === 0)
      console.error(
        `  join ${((performance.now() - started) / 1000).toFixed(0)} s: ${JSON.stringify(now)}, ` +
          `sessions ${(await gatewaySample()).sessions}, load ${load()}`,
      );
    await sleep(500);
  }
  const joinedSeconds = (performance.now() - started) / 1000;
  const unreachableWhileJoining = peakUnreachable;
  peakUnreachable = 0;
  console.error(
    `fleet joined and ready: ${joinedSeconds.toFixed(1)} s (agents all started after ${agentsSeconds.toFixed(1)} s); load ${load()}`,
  );

  const files = new Map([['bin/bcd', Buffer.from('#!/bin/sh\n# simulated bcd 1.1.0\n')]]);
  const manifest = {
    channel: 'stable',
    version: '1.1.0',
    protocolVersion: currentProtocolVersion,
    minControlPlaneVersion: '0.1.0',
    files: [...files].map(([p, c]) => releaseFileEntry(p, c)),
    expiresAt: new Date(Date.now() + 86_400_000).toISOString(),
  };
  const release = await compute.api.releases.publish(root, {
    manifest,
    signatures: [signRelease(manifest, signer.privateKeyPem)],
    files: [...files].map(([p, c]) => ({ path: p, content: c.toString('base64') })),
  });

  const nodeIds = (await bench.db.selectFrom('nodes').select('id').execute()).map((n) => n.id);
  await fleetSamples();
  const before = await commandLatencies(nodeIds, () => true, 15);
  const idleFleet = await fleetSamples();
  console.error(`commands before: n ${before.length}; load ${load()}`);

  const gatewayBefore = await gatewaySample();
  const t0 = performance.now();
  const rollout = await compute.api.rollouts.create(root, {
    releaseId: release.id,
    selector: { poolIds },
    idempotencyKey: 'bench',
  });
  let state = 'running';
  const watch = (async () => {
    for (let tick = 0; state === 'running'; tick++) {
      const view = await compute.api.rollouts.get(root, { rolloutId: rollout.id });
      state = view.state;
      await connectivity();
      if (tick % 8 === 0) {
        const sum = (k: 'done' | 'inProgress' | 'failed') => view.waves.reduce((n, w) => n + (w[k] ?? 0), 0);
        const fleet = await fleetSamples();
        const gw = await gatewaySample();
        console.error(
          `  rollout ${((performance.now() - t0) / 1000).toFixed(0)} s: ${state}, wave ${view.currentWave + 1}, ` +
            `done ${sum('done')}, in progress ${sum('inProgress')}, failed ${sum('failed')}, ` +
            `sessions ${gw.sessions}, unreachable peak ${peakUnreachable}, gateway loop p99 ` +
            `${gw.loopDelayP99Ms.toFixed(0)} ms, gateway CPU ${gw.cpuSeconds.toFixed(0)} s, fleet loop p99 max ${Math.max(...fleet.map((f) => f.loopDelayP99Ms)).toFixed(0)} ms, load ${load()}`,
        );
      }
      await sleep(2_000);
    }
  })();
  const during = await commandLatencies(nodeIds, () => state === 'running', 7_200);
  await watch;
  const totalSeconds = (performance.now() - t0) / 1000;
  const gatewayAfter = await gatewaySample();
  const final = await compute.api.rollouts.get(root, { rolloutId: rollout.id });

  // Peak per pool, replayed from the outbox in commit order.
  const { rows: events } = await sql<{ type: string; data: { nodeId?: string; poolId?: string } }>`
    SELECT type, data FROM outbox_events WHERE subject = ${`rollout/${rollout.id}`} ORDER BY xid, seq`.execute(
    bench.db,
  );
  const updating = new Map<string, Set<string>>();
  const peak = new Map<string, number>();
  for (const e of events) {
    if (!e.data.nodeId || !e.data.poolId) continue;
    const set = updating.get(e.data.poolId) ?? new Set();
    updating.set(e.data.poolId, set);
    if (e.type === 'rollout.node-updating') set.add(e.data.nodeId);
    if (['rollout.node-updated', 'rollout.node-failed'].includes(e.type)) set.delete(e.data.nodeId);
    peak.set(e.data.poolId, Math.max(peak.get(e.data.poolId) ?? 0, set.size));
  }
  const summary = (samples: CommandSample[]) => {
    const s = samples.map((x) => x.ms).sort((x, y) => x - y);
    return { n: s.length, p50: Math.round(percentile(s, 50)), p99: Math.round(percentile(s, 99)) };
  };
  // A command to a node between its update's start and its verdict waits for the restart; the rest
  // show what the rollout costs every other node.
  const windows = new Map(
    (
      await bench.db
        .selectFrom('rollout_nodes')
        .select(['node_id', 'started_at', 'finished_at'])
        .where('rollout_id', '=', rollout.id)
        .execute()
    ).map((r) => [r.node_id, r]),
  );
  const inUpdate = (x: CommandSample) => {
    const w = windows.get(x.nodeId);
    return (
      !!w?.started_at &&
      w.started_at.getTime() <= x.atMs &&
      (!w.finished_at || x.atMs <= w.finished_at.getTime())
    );
  };
  const b = summary(before);
  const d = summary(during);
  const dOthers = summary(during.filter((x) => !inUpdate(x)));
  const dUpdating = summary(during.filter(inUpdate));
  console.log(
    JSON.stringify(
      {
        nodes,
        pools: poolCount,
        fleetProcesses,
        soakSeconds,
        joinedSeconds: Math.round(joinedSeconds),
        unreachableWhileJoining,
        state: final.state,
        done: final.waves.reduce((n, w) => n + w.done, 0),
        failed: final.waves.reduce((n, w) => n + w.failed, 0),
        totalSeconds: Math.round(totalSeconds),
        failures: final.waves.flatMap((w) => w.failures.map((f) => f.reason)).slice(0, 10),
        peakUnreachableDuringRollout: peakUnreachable,
        gatewayDuringRollout: {
          cpuSeconds: Number((gatewayAfter.cpuSeconds - gatewayBefore.cpuSeconds).toFixed(1)),
          loopDelayP99Ms: Math.round(gatewayAfter.loopDelayP99Ms),
        },
        budgets: final.budgets.map((x) => ({
          poolId: x.poolId,
          maxUpdating: x.maxUpdating,
          peak: peak.get(x.poolId) ?? 0,
        })),
        commandLatencyMs: {
          before: b,
          during: d,
          ratio: { p50: Number((d.p50 / b.p50).toFixed(2)), p99: Number((d.p99 / b.p99).toFixed(2)) },
          duringToNodesNotUpdating: dOthers,
          duringToNodesUpdating: dUpdating,
          ratioNotUpdating: {
            p50: Number((dOthers.p50 / b.p50).toFixed(2)),
            p99: Number((dOthers.p99 / b.p99).toFixed(2)),
          },
        },
        fleetProcessIdle: idleFleet.map((f) => ({
          loopDelayP99Ms: Math.round(f.loopDelayP99Ms),
          rssMiB: Math.round(f.rssMiB),
        })),
        loadAverage: { before: loadBefore, after: load() },
      },
      null,
      2,
    ),
  );
} finally {
  // The gateway stops on its own (writing its CPU profile when asked for one).
  const gatewayExited = new Promise((resolve) => gateway.once('exit', resolve));
  gateway.send({ type: 'stop' });
  await Promise.race([gatewayExited, sleep(30_000)]);
  for (const child of children) child.kill('SIGKILL');
  await temporal.close();
  await stopTemporal?.();
  await bench.dispose();
  rmSync(dir, { recursive: true, force: true });
}
process.exit(0);
