// The gateway of bench/rollout.ts and bench/herd.ts in a Node.js process of its own (as `serve --mode gateway` runs
// it), so 1,000 sessions' heartbeats, joins and command deliveries never queue behind the API,
// the benchmark's own load or the rollout's watcher. IPC: sends { address, caCertificatePem } once
// listening and { completed, atMs } for every command result stored; answers each
// { type: 'sample' } with its sessions, CPU seconds, RSS and event-loop delay p99 since the last sample;
// stops (and so writes a --cpu-prof profile) on { type: 'stop' }.

import { monitorEventLoopDelay } from 'node:perf_hooks';
import { parseConfig } from '../core/config.ts';
import { createLogger } from '../core/logger.ts';
import { createDb } from '../db/pool.ts';
import type { GatewayOptions } from '../gateway/options.ts';
import { startGateway } from '../gateway/server.ts';

const input = JSON.parse(process.argv[2] ?? '{}') as {
  databaseUrl: string;
  env: Record<string, string>;
  options: Partial<GatewayOptions>;
};
const log = createLogger({ level: 'warn', name: 'bench-rollout-gateway' });
const { db, close } = createDb(input.databaseUrl, { max: 20, applicationName: 'bench-gateway' });
const loopDelay = monitorEventLoopDelay({ resolution: 10 });
loopDelay.enable();
const gateway = await startGateway({
  config: parseConfig(input.env),
  db,
  log,
  host: '127.0.0.1',
  port: 0,
  options: input.options,
  // wall time: compared with the benchmark's enqueue stamps in another process on this machine
  onCommandCompleted: (id) => process.send!({ completed: id, atMs: Date.now() }),
});
process.on('message', async (message: { type: string }) => {
  if (message.type === 'stop') {
    await gateway.stop();
    await close();
    process.exit(0);
  }
  const cpu = process.cpuUsage();
  process.send!({
    sample: {
      ...gateway.stats(),
      cpuSeconds: (cpu.user + cpu.system) / 1e6,
      loopDelayP99Ms: loopDelay.percentile(99) / 1e6,
      rssMiB: process.memoryUsage().rss / 1024 / 1024,
    },
  });
  loopDelay.reset();
});
process.send!({ address: gateway.address, caCertificatePem: gateway.caCertificatePem });
