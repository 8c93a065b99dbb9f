/**
 * The gateway under a simulated fleet. The gateway runs in this process; the fleet runs as
 * `bcd sim` in a child process (N real agents, each with its own key, certificate, TLS connection,
 * session and journal), so the figures below are the gateway's own:
 *   1. identities, one of two ways (`--provision`):
 *      - `join` (the default): N machines join with one token (keys, CSRs, certificates, one
 *        transaction each) and open their first sessions; the join rate is reported;
 *      - `direct`: the benchmark writes N node rows, key pairs and certificates itself (the same
 *        CA, `insertJoinedNode` and `issueStoredNodeCertificate` that JoinService uses) into the
 *        directories `bcd sim` reads, so that large fleets measure sessions, not join throughput;
 *   2. connect: the fleet starts (after `join`: restarts) with its identities and every node opens
 *      a session: the time until all N are connected (after `direct` the first sessions, which
 *      also send their full inventory), and the gateway's memory per session (heap, RSS deltas);
 *   3. heartbeats: the gateway's CPU over an idle window, per 1,000 heartbeats;
 *   4. commands: `diag.nvml` enqueued at a steady rate to random nodes; latency from the
 *      enqueue's commit to the node's result stored, p50 and p99.
 * Usage: node --expose-gc --import tsx bench/gateway.ts [--nodes 2000] [--heartbeat-ms 10000]
 *        [--idle-seconds 20] [--commands 1000] [--rate 50] [--provision join|direct]
 *        [--connect-seconds 600]
 */
import { spawn } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { loadavg, tmpdir } from 'node:os';
import path from 'node:path';
import { monitorEventLoopDelay } from 'node:perf_hooks';
import { parseArgs } from 'node:util';
import { parseConfig } from '../core/config.ts';
import { createLogger } from '../core/logger.ts';
import { defaultSimShape, SimHardware } from '../daemon/hardware.ts';
import { saveIdentity } from '../daemon/identity.ts';
import { simulatedNodeLayout } from '../daemon/sim.ts';
import { loadSigningCertificateAuthority } from '../db/nodes/certificate-authority.ts';
import { issueStoredNodeCertificate } from '../db/nodes/certificates.ts';
import { insertPool, insertSite } from '../db/nodes/fleet.ts';
import { createJoinToken } from '../db/nodes/join-tokens.ts';
import { insertJoinedNode } from '../db/nodes/nodes.ts';
import { computeHardwareKey } from '../domain/hardware-key.ts';
import { generateKeyPairPem, keyIdOfPublicKey, nodeSpiffeId } from '../domain/pki.ts';
import { createSealer } from '../domain/sealing.ts';
import { defaultGatewayOptions } from '../gateway/options.ts';
import { startGateway } from '../gateway/server.ts';
import { benchDatabase, percentile, probeCommands } from './support.ts';

const { values } = parseArgs({
  options: {
    nodes: { type: 'string', default: '2000' },
    'heartbeat-ms': { type: 'string', default: '10000' },
    'idle-seconds': { type: 'string', default: '20' },
    commands: { type: 'string', default: '1000' },
    rate: { type: 'string', default: '50' },
    profile: { type: 'string' },
    provision: { type: 'string', default: 'join' },
    'connect-seconds': { type: 'string', default: '600' },
  },
});
if (values.provision !== 'join' && values.provision !== 'direct') {
  throw new Error('--provision is join or direct');
}
const provision = values.provision;
const connectTimeoutMs = Number(values['connect-seconds']) * 1000;
const nodes = Number(values.nodes);
const heartbeatMs = Number(values['heartbeat-ms']);
const idleSeconds = Number(values['idle-seconds']);
const commandCount = Number(values.commands);
const rate = Number(values.rate);

const gc = (globalThis as { gc?: () => void }).gc;
const mib = (bytes: number) => (bytes / 1024 / 1024).toFixed(1);
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
async function until(check: () => boolean, timeoutMs: number, what = 'condition'): Promise<void> {
  const deadline = Date.now() + timeoutMs; // wall time: a bound on the wait
  while (!check()) {
    // wall time: the same bound
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await sleep(50);
  }
}
const load = () =>
  loadavg()
    .map((l) => l.toFixed(2))
    .join(' ');
/** The gateway process's event-loop delay, p99 since the last call (ms). */
const loopDelay = monitorEventLoopDelay({ resolution: 10 });
loopDelay.enable();
function loopP99(): string {
  const p99 = loopDelay.percentile(99) / 1e6;
  loopDelay.reset();
  return `${p99.toFixed(0)} ms`;
}
/** A child process's CPU seconds (user + system) and RSS from /proc (Linux), for the fleet side. */
function childUsage(pid: number | undefined): { cpuSeconds: number; rssMiB: number } | null {
  if (!pid) return null;
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
    const cpuSeconds = (Number(fields[11]) + Number(fields[12])) / 100; // utime + stime in ticks
    const rssKiB = Number(/VmRSS:\s+(\d+)/.exec(readFileSync(`/proc/${pid}/status`, 'utf8'))?.[1] ?? 0);
    return { cpuSeconds, rssMiB: rssKiB / 1024 };
  } catch {
    return null;
  }
}

const bench = await benchDatabase('gateway', { max: 20 });
// A deployment secret of this run only: the benchmark's database is its own and dropped after.
const config = parseConfig({ BETTER_COMPUTE_SECRET: randomBytes(32).toString('base64') });
const dir = mkdtempSync(path.join(tmpdir(), 'bc-bench-gw-'));
const log = createLogger({ level: 'warn', name: 'bench-gateway' });
const completedAt = new Map<string, number>();
const gateway = await startGateway({
  config,
  db: bench.db,
  log,
  host: '127.0.0.1',
  port: 0,
  options: { heartbeatIntervalMs: heartbeatMs, maxSessions: nodes + 100 },
  // wall time: compared with probeCommands' enqueue stamps
  onCommandCompleted: (id) => completedAt.set(id, Date.now()),
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
const fleetDir = path.join(dir, 'fleet');

/**
 * `--provision direct`: what N joins would leave behind, without the Join RPC: a node row per
 * machine (`insertJoinedNode`, with the hardware key its simulated evidence gives), an ECDSA P-256
 * key and a node certificate from the same CA with JoinService's profile
 * (`issueStoredNodeCertificate`), written where `bcd sim` loads identities from.
 */
async function provisionDirect(): Promise<void> {
  // The benchmark signs as the gateway does, so it opens the CA key the gateway's way.
  const ca = await loadSigningCertificateAuthority(bench.db, {
    trustDomain: config.BETTER_COMPUTE_TRUST_DOMAIN,
    sealer: createSealer(config.BETTER_COMPUTE_SECRET!),
  });
  const batch = 100;
  let next = 0;
  const worker = async () => {
    while (next < nodes) {
      const first = next;
      next = Math.min(nodes, next + batch);
      const indices = Array.from({ length: next - first }, (_, i) => first + i);
      const keys = await Promise.all(indices.map(() => generateKeyPairPem()));
      const identities = await bench.db.transaction().execute(async (trx) => {
        const created = [];
        for (const index of indices) {
          const layout = simulatedNodeLayout(fleetDir, index);
          const evidence = new SimHardware(layout.hardwareSeed, defaultSimShape).evidence();
          const node = await insertJoinedNode(trx, {
            siteId,
            poolId,
            name: layout.name,
            hardwareKey: computeHardwareKey(evidence).key,
          });
          created.push({ ...node, dir: layout.dir });
        }
        return Promise.all(
          created.map(async (node, i) => {
            const { publicKeyPem, privateKeyPem } = keys[i]!;
            const spiffeId = nodeSpiffeId(config.BETTER_COMPUTE_TRUST_DOMAIN, siteId, node.id);
            const cert = await issueStoredNodeCertificate(
              trx,
              { ca, certificateTtlMs: defaultGatewayOptions.certificateTtlMs },
              {
                nodeId: node.id,
                nodeName: node.name,
                role: 'node',
                spiffeId,
                publicKeyPem,
                keyId: keyIdOfPublicKey(publicKeyPem),
              },
            );
            return {
              dir: node.dir,
              identity: {
                nodeId: node.id,
                nodeName: node.name,
                siteId,
                poolId,
                spiffeId,
                gateway: gateway.address,
                privateKeyPem,
                publicKeyPem,
                certificatePem: cert.certificatePem,
                caCertificatePem: ca.certificatePem,
              },
            };
          }),
        );
      });
      for (const { dir: nodeDir, identity } of identities) saveIdentity(nodeDir, identity);
    }
  };
  await Promise.all(Array.from({ length: 4 }, worker));
}

function startFleet() {
  const child = spawn(
    process.execPath,
    [
      // 10,000 agents' TLS connections, journals and timers outgrow the default old space.
      '--max-old-space-size=8192',
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
      fleetDir,
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

let fleet: ReturnType<typeof startFleet> | undefined;
try {
  console.log(
    `gateway benchmark: ${nodes} simulated nodes, heartbeat every ${heartbeatMs} ms, ` +
      `lease ${config.BETTER_COMPUTE_GATEWAY_LEASE_SECONDS} s, identities by ${provision}; load average ${load()}`,
  );
  // 1. identities
  let t0 = performance.now();
  if (provision === 'join') {
    fleet = startFleet();
    await until(() => gateway.sessionCount() >= nodes, connectTimeoutMs, 'all joins');
    const joinSeconds = (performance.now() - t0) / 1000;
    console.log(
      `join + first connect: ${nodes} nodes in ${joinSeconds.toFixed(1)} s (${(nodes / joinSeconds).toFixed(0)} joins/s)`,
    );
    fleet.kill('SIGKILL');
    await until(() => gateway.sessionCount() === 0, 60_000, 'the sessions to end');
  } else {
    await provisionDirect();
    console.log(
      `identities provisioned directly (no Join RPC): ${nodes} in ${((performance.now() - t0) / 1000).toFixed(1)} s`,
    );
  }

  // 2. connect with existing identities; memory per session
  gc?.();
  await sleep(500);
  gc?.();
  const before = process.memoryUsage();
  t0 = performance.now();
  fleet = startFleet();
  const connectPid = fleet.pid;
  loopP99();
  const progress = setInterval(() => {
    console.log(
      `  ${((performance.now() - t0) / 1000).toFixed(0)} s: ${JSON.stringify(gateway.stats())}, ` +
        `gateway event-loop delay p99 ${loopP99()}, load average ${load()}`,
    );
  }, 15_000);
  await until(() => gateway.sessionCount() >= nodes, connectTimeoutMs, 'all sessions')
    .catch((error) => {
      console.log(`  only ${gateway.sessionCount()} of ${nodes} sessions open: ${(error as Error).message}`);
      throw error;
    })
    .finally(() => clearInterval(progress));
  const connectSeconds = (performance.now() - t0) / 1000;
  console.log('  gateway registry:', JSON.stringify(gateway.stats()), `load average ${load()}`);
  await sleep(2_000);
  gc?.();
  await sleep(500);
  gc?.();
  const after = process.memoryUsage();
  const heapPer = (after.heapUsed - before.heapUsed) / nodes;
  const rssPer = (after.rss - before.rss) / nodes;
  console.log(
    `connect: all ${nodes} sessions in ${connectSeconds.toFixed(1)} s (includes the child process starting` +
      `${provision === 'direct' ? ' and every first inventory' : ''}); ` +
      `memory per session: heap ${(heapPer / 1024).toFixed(1)} KiB, rss ${(rssPer / 1024).toFixed(1)} KiB ` +
      `(heap ${mib(before.heapUsed)} → ${mib(after.heapUsed)} MiB, rss ${mib(before.rss)} → ${mib(after.rss)} MiB)`,
  );

  // 3. heartbeats: gateway CPU over an idle window
  const inspector = values.profile ? new (await import('node:inspector')).Session() : null;
  if (inspector) {
    inspector.connect();
    await new Promise((r) => inspector.post('Profiler.enable', () => inspector.post('Profiler.start', r)));
  }
  loopP99();
  const cpu0 = process.cpuUsage();
  const fleet0 = childUsage(connectPid);
  const w0 = performance.now();
  await sleep(idleSeconds * 1000);
  const cpu = process.cpuUsage(cpu0);
  const fleet1 = childUsage(connectPid);
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
      `${((cpuMs / heartbeats) * 1000).toFixed(0)} ms per 1,000 heartbeats (delivery loop included); ` +
      `sessions still open ${gateway.sessionCount()}; event-loop delay p99 ${loopP99()}; ` +
      `gateway RSS now ${mib(process.memoryUsage().rss)} MiB; load average ${load()}`,
  );
  if (fleet0 && fleet1) {
    console.log(
      `  fleet process (all ${nodes} agents): CPU ${(((fleet1.cpuSeconds - fleet0.cpuSeconds) / wall) * 100).toFixed(1)}% ` +
        `of one core over the idle window, RSS ${fleet1.rssMiB.toFixed(0)} MiB`,
    );
  }

  // 4. command latency
  const { rows } = await import('kysely').then(({ sql }) =>
    sql<{ id: string }>`SELECT id FROM nodes WHERE connectivity = 'connected'`.execute(bench.db),
  );
  loopP99();
  const start = performance.now();
  const probes = await probeCommands(bench.db, {
    nodeIds: rows.map((r) => r.id),
    rate,
    count: commandCount,
    completedAt,
  });
  const commandSeconds = (performance.now() - start) / 1000;
  const latencies = probes.flatMap((p) => (p.ms === null ? [] : [p.ms])).sort((a, b) => a - b);
  console.log(
    `commands: ${latencies.length}/${commandCount} completed at ${rate}/s; enqueue → result stored: ` +
      `p50 ${percentile(latencies, 50).toFixed(0)} ms, p99 ${percentile(latencies, 99).toFixed(0)} ms, ` +
      `max ${latencies.at(-1)?.toFixed(0)} ms (${commandSeconds.toFixed(1)} s); ` +
      `sessions open ${gateway.sessionCount()}; event-loop delay p99 ${loopP99()}; load average ${load()}`,
  );
  // The last line, for scripts that run this one (bench/scale.ts --commands).
  console.log(
    JSON.stringify({
      nodes,
      connectSeconds: Number(connectSeconds.toFixed(1)),
      commands: {
        enqueued: commandCount,
        completed: latencies.length,
        perSecond: rate,
        p50Ms: Math.round(percentile(latencies, 50)),
        p99Ms: Math.round(percentile(latencies, 99)),
      },
    }),
  );
} finally {
  fleet?.kill('SIGKILL');
  await gateway.stop();
  await bench.dispose();
  rmSync(dir, { recursive: true, force: true });
}
process.exit(0);
