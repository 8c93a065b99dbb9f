// One part of the control plane in a process of its own, so a test can SIGKILL it under load and
// start it again: `api` (the HTTP API on `port`), `worker` (the Temporal worker with the orphan
// sweeper) or `gateway` (bcd sessions on `port`). Prints one line `ready <json>` once it serves.
// Usage: node --import tsx tests/support/plane-child.ts '<json PlaneChildOptions>'

import { parseConfig } from '../../core/config.ts';
import { createDb } from '../../db/pool.ts';
import type { LifecycleTimers } from '../../domain/reservation-lifecycle.ts';
import { startGateway } from '../../gateway/server.ts';
import { createEmbeddedIam } from '../../iam/embedded/index.ts';
import { createCompute } from '../../server/compute.ts';
import { listen } from '../../server/http.ts';
import { connectTemporal } from '../../temporal/client.ts';
import { createTemporalLifecycle } from '../../temporal/lifecycle.ts';
import type { PoolPlacerOptions } from '../../temporal/pool-placer.ts';
import { startWorker } from '../../temporal/worker.ts';
import { testLogger } from './logger.ts';

export interface PlaneChildOptions {
  role: 'api' | 'worker' | 'gateway';
  databaseUrl: string;
  temporalAddress: string;
  taskQueue: string;
  timers: Partial<LifecycleTimers>;
  /** The API's or the gateway's port (0: a free one). */
  port?: number;
  activityTimeoutMs?: number;
  sweeper?: { everyMs: number; graceMs: number; scheduleId: string };
  /** Configuration variables, as the process environment would give them. */
  env?: Record<string, string>;
  /** The worker's pool-lease placer (short lease TTLs for failover tests); `false` runs none. */
  poolPlacer?: false | PoolPlacerOptions;
}

const options = JSON.parse(process.argv[2] ?? '{}') as PlaneChildOptions;
const log = testLogger(`${options.role}-child`, process.env.LOG_LEVEL ?? 'warn');
const config = parseConfig(options.env ?? {});
const { db } = createDb(options.databaseUrl, { max: 8, applicationName: `${options.role}-child` });
const iam = createEmbeddedIam({ db, log });
const lifecycleOptions = {
  taskQueue: options.taskQueue,
  timers: options.timers,
  ...(options.activityTimeoutMs ? { activityTimeoutMs: options.activityTimeoutMs } : {}),
};

const ready = (info: Record<string, unknown>) => process.stdout.write(`ready ${JSON.stringify(info)}\n`);

switch (options.role) {
  case 'api': {
    const temporal = await connectTemporal({ address: options.temporalAddress });
    const lifecycle = createTemporalLifecycle(temporal.client, lifecycleOptions);
    const compute = createCompute({ config, db, log, iam, temporal: temporal.client, lifecycle });
    const server = await listen(compute.app, '127.0.0.1', options.port ?? 0);
    ready({ url: server.url, port: server.port });
    break;
  }
  case 'worker': {
    await startWorker({
      db,
      log,
      iam,
      address: options.temporalAddress,
      taskQueue: options.taskQueue,
      timers: options.timers,
      lifecycle: lifecycleOptions,
      sweeper: options.sweeper ?? false,
      ...(options.poolPlacer !== undefined ? { poolPlacer: options.poolPlacer } : {}),
    });
    ready({});
    break;
  }
  case 'gateway': {
    const temporal = await connectTemporal({ address: options.temporalAddress });
    const gateway = await startGateway({
      config,
      db,
      log,
      lifecycle: createTemporalLifecycle(temporal.client, lifecycleOptions),
      host: '127.0.0.1',
      port: options.port ?? 0,
      options: { deliveryIntervalMs: 100 },
    });
    ready({ address: gateway.address, port: gateway.port, caCertificatePem: gateway.caCertificatePem });
    break;
  }
}
