/**
 * The gateway under a simulated fleet. The gateway runs in this process; the fleet runs as
 * `bcd sim` in a child process (N real agents, each with its own key, certificate, TLS connection,
 * session and journal), so the figures below are the gateway's own:
 *   1. join: N machines join with one token (keys, CSRs, certificates, one transaction each);
 *   2. connect: the fleet restarts with its identities and every node opens a session: the time
 *      until all N are connected, and the gateway's memory per session (heap and RSS deltas);
 *   3. heartbeats: the gateway's CPU over an idle window, per 1,000 heartbeats;
 *   4. commands: `diag.nvml` enqueued at a steady rate to random nodes; latency from the
 *      enqueue's commit to the node's result stored, p50 and p99.
 * Usage: node --expose-gc --import tsx bench/gateway.ts [--nodes 2000] [--heartbeat-ms 10000]
 *        [--idle-seconds 20] [--commands 1000] [--rate 50]
 */
import { spawn } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { parseArgs } from 'node:util';
import { enqueueNodeCommand } from '../db/commands.ts';
import { insertPool, insertSite } from '../db/fleet.ts';
import { createJoinToken } from '../db/join-tokens.ts';
import { startGateway } from '../gateway/server.ts';
import { parseConfig } from '../server/config.ts';
import { createLogger } from '../server/logger.ts';
import { benchDatabase, percentile } from './support.ts';

const { values } = parseArgs({
  options: {
    nodes: { type: 'string', default: '2000' },
    'heartbeat-ms': { type: 'string', default: '10000' },
    'idle-seconds': { type: 'string', default: '20' },
    commands: { type: 'string', default: '1000' },
    rate: { type: 'string', default: '50' },
    profile: { type: 'string' },
  },
});
const nodes = Number(values.nodes);
const heartbeatMs = Number(values['heartbeat-ms']);
const idleSeconds = Number(values['idle-seconds']);
const commandCount = Number(values.commands);
const rate = Number(values.rate);

const gc = (globalThis as { gc?: () => void }).gc;
const mib = (bytes: number) => (bytes / 1024 / 1024).toFixed(1);
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
async function until(check: () => boolean, timeoutMs: number): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!check()) {
    if (Date.now() > deadline) throw new Error('timed out');
    await sleep(50);
  }
}

const bench = await benchDatabase('gateway', { max: 20 });
const dir = mkdtempSync(path.join(tmpdir(), 'bc-bench-gw-'));
const log = createLogger({ level: 'warn', name: 'bench-gateway' });
const completedAt = new Map<string, number>();
const gateway = await startGateway({
  config: parseConfig({}),
  db: bench.db,
  log,
  host: '127.0.0.1',
  port: 0,
  options: { heartbeatIntervalMs: heartbeatMs, maxSessions: nodes + 100 },
  onCommandCompleted: (id) => completedAt.set(id, performance.now()),
});
const caFile = path.join(dir, 'ca.pem');
writeFileSync(caFile, gateway.caCertificatePem);
const siteId = await insertSite(bench.db, { name: 'bench', region: 'eu-1' });
const poolId = await insertPool(bench.db, {
  siteId,
  ownerTenantId: 'tnt_root',
  name: 'h100',
  gpuModel: 'h100',
});
const { token } = await createJoinToken(bench.db, { poolId, ttlSeconds: 3600, maxUses: nodes });

function startFleet() {
  const child = spawn(
    process.execPath,
    [
      'bin/bcd.js',
      'sim',
      '--nodes',
      String(nodes),
      '--gateway',
      gateway.address,
      '--ca-file',
      caFile,
      '--token',
      token,
      '--dir',
      path.join(dir, 'fleet'),
      '--join-concurrency',
      '16',
      '--log-level',
      'error',
    ],
    { stdio: ['ignore', 'pipe', 'inherit'] },
  );
  const spawned = performance.now();
  child.stdout.once('data', () => {
    console.log(
      `  (the fleet process started all its agents ${((performance.now() - spawned) / 1000).toFixed(1)} s after spawn)`,
    );
  });
  child.stdout.resume();
  return child;
}

try {
  console.log(`gateway benchmark: ${nodes} simulated nodes, heartbeat every ${heartbeatMs} ms`);
  // 1. join
  let t0 = performance.now();
  let fleet = startFleet();
  await until(() => gateway.sessionCount() >= nodes, 600_000);
  const joinSeconds = (performance.now() - t0) / 1000;
  console.log(
    `join + first connect: ${nodes} nodes in ${joinSeconds.toFixed(1)} s (${(nodes / joinSeconds).toFixed(0)} joins/s)`,
  );
  fleet.kill('SIGKILL');
  await until(() => gateway.sessionCount() === 0, 60_000);

  // 2. connect with existing identities; memory per session
  gc?.();
  await sleep(500);
  gc?.();
  const before = process.memoryUsage();
  t0 = performance.now();
  fleet = startFleet();
  await until(() => gateway.sessionCount() >= nodes, 600_000);
  const connectSeconds = (performance.now() - t0) / 1000;
  console.log('  gateway registry:', JSON.stringify(gateway.stats()));
  await sleep(2_000);
  gc?.();
  await sleep(500);
  gc?.();
  const after = process.memoryUsage();
  const heapPer = (after.heapUsed - before.heapUsed) / nodes;
  const rssPer = (after.rss - before.rss) / nodes;
  console.log(
    `connect: all ${nodes} sessions in ${connectSeconds.toFixed(1)} s (includes the child process starting); ` +
      `memory per session: heap ${(heapPer / 1024).toFixed(1)} KiB, rss ${(rssPer / 1024).toFixed(1)} KiB ` +
      `(heap ${mib(before.heapUsed)} → ${mib(after.heapUsed)} MiB, rss ${mib(before.rss)} → ${mib(after.rss)} MiB)`,
  );

  // 3. heartbeats: gateway CPU over an idle window
  const inspector = values.profile ? new (await import('node:inspector')).Session() : null;
  if (inspector) {
    inspector.connect();
    await new Promise((r) => inspector.post('Profiler.enable', () => inspector.post('Profiler.start', r)));
  }
  const cpu0 = process.cpuUsage();
  const w0 = performance.now();
  await sleep(idleSeconds * 1000);
  const cpu = process.cpuUsage(cpu0);
  const wall = (performance.now() - w0) / 1000;
  if (inspector) {
    const profile = await new Promise<unknown>((resolve) =>
      inspector.post('Profiler.stop', (_err, result) => resolve(result.profile)),
    );
    writeFileSync(values.profile!, JSON.stringify(profile));
    inspector.disconnect();
  }
  const heartbeats = (nodes * wall * 1000) / heartbeatMs;
  const cpuMs = (cpu.user + cpu.system) / 1000;
  console.log(
    `heartbeats: ~${heartbeats.toFixed(0)} in ${wall.toFixed(1)} s (${(heartbeats / wall).toFixed(0)}/s): ` +
      `gateway CPU ${cpuMs.toFixed(0)} ms = ${((cpuMs / 1000 / wall) * 100).toFixed(1)}% of one core, ` +
      `${((cpuMs / heartbeats) * 1000).toFixed(0)} ms per 1,000 heartbeats (delivery loop included)`,
  );

  // 4. command latency
  const { rows } = await import('kysely').then(({ sql }) =>
    sql<{ id: string }>`SELECT id FROM nodes WHERE connectivity = 'connected'`.execute(bench.db),
  );
  const enqueuedAt = new Map<string, number>();
  const interval = 1000 / rate;
  const start = performance.now();
  for (let i = 0; i < commandCount; i++) {
    const due = start + i * interval;
    const wait = due - performance.now();
    if (wait > 0) await sleep(wait);
    const nodeId = rows[Math.floor(Math.random() * rows.length)]!.id;
    const command = await bench.db
      .transaction()
      .execute((trx) => enqueueNodeCommand(trx, { nodeId, kind: 'diag.nvml', payload: { level: 'quick' } }));
    enqueuedAt.set(command.id, performance.now());
  }
  await until(() => [...enqueuedAt.keys()].every((id) => completedAt.has(id)), 60_000).catch(() => {});
  const latencies = [...enqueuedAt.entries()]
    .filter(([id]) => completedAt.has(id))
    .map(([id, t]) => completedAt.get(id)! - t)
    .sort((a, b) => a - b);
  console.log(
    `commands: ${latencies.length}/${commandCount} completed at ${rate}/s; enqueue → result stored: ` +
      `p50 ${percentile(latencies, 50).toFixed(0)} ms, p99 ${percentile(latencies, 99).toFixed(0)} ms, ` +
      `max ${latencies.at(-1)?.toFixed(0)} ms`,
  );
  fleet.kill('SIGKILL');
} finally {
  await gateway.stop();
  await bench.dispose();
  rmSync(dir, { recursive: true, force: true });
}
process.exit(0);
