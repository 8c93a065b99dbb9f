/**
 * The herd (issue 14): N machines join one gateway with a join token and open their sessions,
 * all at once, the way a fleet powering on does. The gateway runs in a Node.js process of its own
 * (`bench/rollout-gateway.ts`, as `serve --mode gateway` runs it, mutual TLS, production lease and
 * heartbeat); the fleet runs as `bcd sim` agents spread over several child processes
 * (`bench/rollout-fleet.ts`), each agent with its own key, CSR, Join, certificate, session and
 * journal. It reports:
 *   - connect: from the first fleet process starting its agents to N sessions established (and
 *     from spawning the fleet processes), and the join rate;
 *   - CPU per Join: the gateway process's CPU (process.cpuUsage over IPC) plus PostgreSQL's
 *     (/proc of the postmaster and its backends) over the herd, divided by the joins. It is the
 *     whole cost of a machine arriving: Join (CSR, token, node row, certificate), the TLS
 *     handshakes, the first session's Hello, inventory and NodeSpec; and the same without the
 *     heartbeats of the nodes already in (their idle cost a session a second, measured over 20 s
 *     at N sessions after the herd, times the session-seconds the herd held);
 *   - commands at N connected nodes: `diag.nvml` to random nodes at a steady rate, enqueue commit
 *     → result stored, p50 and p99 (`probeCommands`);
 *   - the gateway's RSS, and the load average before and after.
 * Every machine joins from 127.0.0.1, so the per-address Join limit is raised to the gateway-wide
 * one; the gateway-wide limit stays the production default unless `--joins-per-second` is given.
 * The last line is one JSON object.
 * Usage: node --import tsx bench/herd.ts [--nodes 10000] [--fleet-processes 8]
 *        [--join-concurrency 8] [--commands 1000] [--rate 50] [--connect-seconds 300]
 *        [--joins-per-second N] [--profile-gateway <dir>] [--profile-fleet <dir>]
 */
import { type ChildProcess, fork } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { loadavg, tmpdir } from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';
import { parseConfig } from '../core/config.ts';
import { createJoinToken } from '../db/nodes/join-tokens.ts';
import { defaultGatewayOptions } from '../gateway/options.ts';
import { forkGateway } from './gateway-child.ts';
import {
  benchDatabase,
  insertBenchPool,
  percentile,
  postgresCpuSeconds,
  postmasterPidOf,
  probeCommands,
} from './support.ts';

const { values } = parseArgs({
  options: {
    nodes: { type: 'string', default: '10000' },
    'fleet-processes': { type: 'string', default: '8' },
    'join-concurrency': { type: 'string', default: '8' },
    commands: { type: 'string', default: '1000' },
    rate: { type: 'string', default: '50' },
    'connect-seconds': { type: 'string', default: '300' },
    'joins-per-second': { type: 'string' },
    /** A directory for the gateway process's CPU profile (node --cpu-prof). */
    'profile-gateway': { type: 'string' },
    /** A directory for the first fleet process's CPU profile. */
    'profile-fleet': { type: 'string' },
  },
});
const nodes = Number(values.nodes);
const fleetProcesses = Math.max(1, Number(values['fleet-processes']));
const joinConcurrency = Number(values['join-concurrency']);
const commandCount = Number(values.commands);
const rate = Number(values.rate);
const connectTimeoutMs = Number(values['connect-seconds']) * 1000;
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
const load = () => loadavg().map((l) => Number(l.toFixed(2)));
const here = (file: string) => fileURLToPath(new URL(file, import.meta.url));
const secret = randomBytes(32).toString('hex');
const loadBefore = load();
console.error(
  `herd: ${nodes} nodes joining over ${fleetProcesses} fleet processes (${joinConcurrency} joins in flight each); load ${loadBefore}`,
);

const bench = await benchDatabase('herd', { max: 4 });
const postmaster = await postmasterPidOf(bench.pool);
const config = parseConfig({ BETTER_COMPUTE_SECRET: secret });
const joinsPerSecond = Number(values['joins-per-second'] ?? config.BETTER_COMPUTE_GATEWAY_JOINS_PER_SECOND);
const children: ChildProcess[] = [];
const completedAt = new Map<string, number>();
const gatewayChild = forkGateway({
  databaseUrl: bench.url,
  env: {
    BETTER_COMPUTE_SECRET: secret,
    BETTER_COMPUTE_GATEWAY_JOINS_PER_SECOND: String(joinsPerSecond),
    // One address for the whole simulated fleet: its limit is the gateway-wide one.
    BETTER_COMPUTE_GATEWAY_JOINS_PER_SECOND_PER_PEER: String(joinsPerSecond),
  },
  options: { maxSessions: Math.max(defaultGatewayOptions.maxSessions, nodes + 100) },
  profileDir: values['profile-gateway'],
  onCompleted: (id, atMs) => completedAt.set(id, atMs),
});
const gateway = gatewayChild.child;
children.push(gateway);
const gatewayListening = gatewayChild.listening;
const gatewaySample = gatewayChild.sample;
const fleets: ChildProcess[] = [];
const dir = mkdtempSync(path.join(tmpdir(), 'bc-bench-herd-'));

try {
  const { address, caCertificatePem } = await gatewayListening;
  const caFile = path.join(dir, 'ca.pem');
  writeFileSync(caFile, caCertificatePem);
  const { poolId } = await insertBenchPool(bench.db);
  const { token } = await createJoinToken(bench.db, { poolId, ttlSeconds: 3600, maxUses: nodes });

  const gw0 = await gatewaySample();
  const pg0 = postgresCpuSeconds(postmaster);
  const spawned = performance.now();
  // wall time: compared with the fleet processes' start stamps
  const spawnedAtMs = Date.now();
  const starts: number[] = [];
  const agentsStarted: Array<Promise<void>> = [];
  for (let f = 0; f < fleetProcesses; f++) {
    const share = Math.floor(nodes / fleetProcesses) + (f < nodes % fleetProcesses ? 1 : 0);
    const child = fork(
      here('./rollout-fleet.ts'),
      [
        JSON.stringify({
          gatewayAddress: address,
          caFile,
          joinToken: token,
          nodes: share,
          rootDir: path.join(dir, `fleet-${f}`),
          namePrefix: `h${f}`,
          joinConcurrency,
          announceStart: true,
        }),
      ],
      // A process holds 1,250 agents' TLS connections, journals and timers at 10,000 nodes.
      {
        execArgv: ['--import', 'tsx', '--max-old-space-size=2048'],
        stdio: ['ignore', 'inherit', 'inherit', 'ipc'],
      },
    );
    agentsStarted.push(
      new Promise((resolve) =>
        child.on('message', (m: { startingAtMs?: number; started?: number }) => {
          if (m.startingAtMs) starts.push(m.startingAtMs);
          if (m.started !== undefined) resolve();
        }),
      ),
    );
    children.push(child);
    fleets.push(child);
  }
  let last = await gatewaySample();
  let complete = true;
  // The sessions held, integrated over the herd: what the heartbeats of the nodes already in cost
  // is this times the idle cost of a session a second (measured at N after the herd).
  let sessionSeconds = 0;
  let lastAt = performance.now();
  for (let tick = 1; last.sessions < nodes; tick++) {
    if (performance.now() - spawned > connectTimeoutMs) {
      // The figures below are then those of the nodes that made it (joins counted in the database).
      console.error(`  only ${last.sessions} of ${nodes} sessions after ${connectTimeoutMs / 1000} s`);
      complete = false;
      break;
    }
    await sleep(250);
    const before = last;
    last = await gatewaySample();
    const now = performance.now();
    sessionSeconds += (((before.sessions + last.sessions) / 2) * (now - lastAt)) / 1000;
    lastAt = now;
    if (tick % 40 === 0) {
      console.error(
        `  ${((performance.now() - spawned) / 1000).toFixed(0)} s: ${last.sessions} sessions, ` +
          `${last.joinsThrottled} joins throttled, gateway loop p99 ${last.loopDelayP99Ms.toFixed(0)} ms, load ${load()}`,
      );
    }
  }
  // wall time: compared with the fleet processes' start stamps
  const connectedAtMs = Date.now();
  const fromSpawnSeconds = (performance.now() - spawned) / 1000;
  const firstStart = Math.min(...starts);
  const connectSeconds = (connectedAtMs - firstStart) / 1000;
  const gatewayCpu = last.cpuSeconds - gw0.cpuSeconds;
  const postgresCpu = postgresCpuSeconds(postmaster) - pg0;
  const { count: joined } = await bench.db
    .selectFrom('nodes')
    .select((eb) => eb.fn.countAll<string>().as('count'))
    .executeTakeFirstOrThrow();
  const joins = Number(joined);
  const cpuMsPerJoin = ((gatewayCpu + postgresCpu) * 1000) / joins;
  console.error(
    `connect: ${last.sessions} sessions ${connectSeconds.toFixed(1)} s after the first fleet process started its agents ` +
      `(${fromSpawnSeconds.toFixed(1)} s from spawning the fleet processes, which took ` +
      `${((firstStart - spawnedAtMs) / 1000).toFixed(1)} s to boot); ${joins} joins, ${(joins / connectSeconds).toFixed(0)} joins/s; ` +
      `CPU per Join ${cpuMsPerJoin.toFixed(2)} ms (gateway ${gatewayCpu.toFixed(1)} s + PostgreSQL ${postgresCpu.toFixed(1)} s); ` +
      `${last.joinsThrottled} joins throttled; gateway RSS ${last.rssMiB.toFixed(0)} MiB; load ${load()}`,
  );

  // Every agent runs (each fleet process answers samples from then on): the fleet side's CPU.
  // (Short of N, the commands go to the connected nodes while the others go on joining.)
  if (complete) await Promise.all(agentsStarted);
  const fleetCpu = (
    await Promise.all(
      (complete ? fleets : []).map(
        (child) =>
          new Promise<number>((resolve) => {
            child.once('message', (m: { cpuSeconds: number }) => resolve(m.cpuSeconds));
            child.send({ type: 'sample' });
          }),
      ),
    )
  ).reduce((a, b) => a + b, 0);
  console.error(
    `  the fleet processes used ${fleetCpu.toFixed(1)} CPU-s in all (${((fleetCpu * 1000) / nodes).toFixed(1)} ms per node: ` +
      `key, CSR, Join, TLS, session, journal, inventory)`,
  );
  // The fleet settles (each first inventory, NodeSpec) before the commands.
  await sleep(5_000);
  // N sessions idle (heartbeats, the 1-s flush, the sweep, the certificate re-check): the cost a
  // connected node adds each second, to tell the herd's Joins from the heartbeats around them.
  const idleSeconds = 20;
  const idle0 = await gatewaySample();
  const idlePg0 = postgresCpuSeconds(postmaster);
  const idleStarted = performance.now();
  await sleep(idleSeconds * 1000);
  const idle1 = await gatewaySample();
  const idleCpu = idle1.cpuSeconds - idle0.cpuSeconds + postgresCpuSeconds(postmaster) - idlePg0;
  const idleCpuMsPerSessionSecond =
    (idleCpu * 1000) / ((idle1.sessions * (performance.now() - idleStarted)) / 1000);
  const heartbeatCpuSeconds = (idleCpuMsPerSessionSecond * sessionSeconds) / 1000;
  const cpuMsPerJoinNet = ((gatewayCpu + postgresCpu - heartbeatCpuSeconds) * 1000) / joins;
  console.error(
    `idle at ${idle1.sessions} sessions: ${((idleCpu / idleSeconds) * 100).toFixed(1)} % of a core ` +
      `(${(idleCpuMsPerSessionSecond * 1000).toFixed(1)} µs a session a second); the herd held ` +
      `${Math.round(sessionSeconds)} session-seconds, about ${heartbeatCpuSeconds.toFixed(1)} CPU-s of heartbeats: ` +
      `CPU per Join without them ${cpuMsPerJoinNet.toFixed(2)} ms; load ${load()}`,
  );
  const nodeIds = (
    await bench.db.selectFrom('nodes').select('id').where('connectivity', '=', 'connected').execute()
  ).map((n) => n.id);
  await gatewaySample();
  const probes = await probeCommands(bench.db, { nodeIds, rate, count: commandCount, completedAt });
  const latencies = probes.flatMap((p) => (p.ms === null ? [] : [p.ms])).sort((a, b) => a - b);
  const afterCommands = await gatewaySample();
  const commands = {
    enqueued: probes.length,
    completed: latencies.length,
    perSecond: rate,
    p50Ms: Math.round(percentile(latencies, 50)),
    p99Ms: Math.round(percentile(latencies, 99)),
    maxMs: Math.round(latencies.at(-1) ?? Number.NaN),
    gatewayLoopDelayP99Ms: Math.round(afterCommands.loopDelayP99Ms),
  };
  console.error(
    `commands at ${afterCommands.sessions} sessions: ${commands.completed}/${commands.enqueued} at ${rate}/s, ` +
      `enqueue commit → result stored p50 ${commands.p50Ms} ms, p99 ${commands.p99Ms} ms, max ${commands.maxMs} ms; ` +
      `gateway loop p99 ${commands.gatewayLoopDelayP99Ms} ms, RSS ${afterCommands.rssMiB.toFixed(0)} MiB; load ${load()}`,
  );
  console.log(
    JSON.stringify({
      nodes,
      connected: last.sessions,
      complete,
      fleetProcesses,
      joinConcurrency,
      joinsPerSecondLimit: joinsPerSecond,
      connectSeconds: Number(connectSeconds.toFixed(1)),
      connectSecondsFromSpawn: Number(fromSpawnSeconds.toFixed(1)),
      joins,
      joinsPerSecond: Math.round(joins / connectSeconds),
      joinsThrottled: last.joinsThrottled,
      cpuMsPerJoin: Number(cpuMsPerJoin.toFixed(2)),
      cpuMsPerJoinWithoutHeartbeats: Number(cpuMsPerJoinNet.toFixed(2)),
      idleCpuUsPerSessionSecond: Number((idleCpuMsPerSessionSecond * 1000).toFixed(1)),
      heartbeatCpuSecondsDuringHerd: Number(heartbeatCpuSeconds.toFixed(1)),
      cpuSeconds: {
        gateway: Number(gatewayCpu.toFixed(1)),
        postgres: Number(postgresCpu.toFixed(1)),
        fleet: Number(fleetCpu.toFixed(1)),
      },
      gatewayRssMiB: Math.round(afterCommands.rssMiB),
      commands,
      loadBefore,
      loadAfter: load(),
    }),
  );
} finally {
  await Promise.all(
    fleets.map((child) => {
      const exited = new Promise((r) => child.once('exit', r));
      child.send({ type: 'stop' });
      return Promise.race([exited, sleep(10_000)]);
    }),
  );
  const gatewayExited = new Promise((r) => gateway.once('exit', r));
  gateway.send({ type: 'stop' });
  await Promise.race([gatewayExited, sleep(10_000)]);
  for (const child of children) if (child.exitCode === null) child.kill('SIGKILL');
  await bench.dispose();
  rmSync(dir, { recursive: true, force: true });
}
process.exit(0);
