// A worker in a process of its own, so a test can SIGKILL it in the middle of an activity.
// Usage: node --import tsx tests/lifecycle/worker-child.ts '<json options>'

import { createDb } from '../../db/pool.ts';
import { createEmbeddedIam } from '../../iam/embedded/index.ts';
import { startWorker } from '../../temporal/worker.ts';
import { testLogger } from '../support/logger.ts';

const options = JSON.parse(process.argv[2] ?? '{}') as {
  databaseUrl: string;
  address: string;
  taskQueue: string;
  timers?: Record<string, number>;
  activityTimeoutMs?: number;
};
const log = testLogger('worker-child', 'warn');
const { db } = createDb(options.databaseUrl, { max: 4, applicationName: 'worker-child' });
await startWorker({
  db,
  log,
  iam: createEmbeddedIam({ db, log }),
  address: options.address,
  taskQueue: options.taskQueue,
  ...(options.timers ? { timers: options.timers } : {}),
  lifecycle: { ...(options.activityTimeoutMs ? { activityTimeoutMs: options.activityTimeoutMs } : {}) },
  sweeper: false,
});
process.stdout.write('ready\n');
