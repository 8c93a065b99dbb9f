// One slice of a simulated fleet (bench/rollout.ts, bench/herd.ts) in a Node.js process of its
// own: `bcd sim` agents (startSimulatedFleet, the same code as the CLI, with the bench's bcd
// version, release pins and name prefix), so their joins, heartbeats and TLS never wait on the
// control plane's event loop. IPC: with `announceStart`, first sends { startingAtMs } (wall time)
// just before the first agent starts; sends { started } once every agent runs, answers each
// { type: 'sample' } with its CPU seconds and event-loop delay p99 since the last sample, stops on
// { type: 'stop' }.

import { readFileSync } from 'node:fs';
import { monitorEventLoopDelay } from 'node:perf_hooks';
import { createLogger } from '../core/logger.ts';
import { startSimulatedFleet } from '../daemon/sim.ts';
import type { ReleaseTrust } from '../domain/release-manifest.ts';

const options = JSON.parse(process.argv[2] ?? '{}') as {
  gatewayAddress: string;
  caFile: string;
  joinToken: string;
  nodes: number;
  rootDir: string;
  namePrefix: string;
  version?: string;
  trust?: ReleaseTrust;
  /** Joins in flight in this process (default 4). */
  joinConcurrency?: number;
  announceStart?: boolean;
};
const log = createLogger({ level: 'error', name: 'bench-rollout-fleet' });
const loopDelay = monitorEventLoopDelay({ resolution: 10 });
loopDelay.enable();
// wall time: compared with the other fleet processes' start in the parent
if (options.announceStart) process.send!({ startingAtMs: Date.now() });
const fleet = await startSimulatedFleet({
  gatewayAddress: options.gatewayAddress,
  caCertificatePem: readFileSync(options.caFile, 'utf8'),
  joinToken: options.joinToken,
  nodes: options.nodes,
  rootDir: options.rootDir,
  namePrefix: options.namePrefix,
  log,
  joinConcurrency: options.joinConcurrency ?? 4,
  minBackoffMs: 200,
  maxBackoffMs: 2_000,
  bcd: {
    ...(options.version ? { version: options.version } : {}),
    ...(options.trust ? { trust: options.trust } : {}),
  },
});
process.on('message', async (message: { type: string }) => {
  if (message.type === 'stop') {
    await fleet.stop();
    process.exit(0);
  }
  const cpu = process.cpuUsage();
  process.send!({
    cpuSeconds: (cpu.user + cpu.system) / 1e6,
    loopDelayP99Ms: loopDelay.percentile(99) / 1e6,
    rssMiB: process.memoryUsage().rss / 1024 / 1024,
  });
  loopDelay.reset();
});
process.send!({ started: fleet.nodes.length });
