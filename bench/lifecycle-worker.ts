// The lifecycle worker of bench/lifecycle.ts in a process of its own, so its memory and CPU are
// measured alone. It answers every IPC message with its process.memoryUsage() and cpuUsage().

import { createLogger } from '../core/logger.ts';
import { createDb } from '../db/pool.ts';
import { createEmbeddedIam } from '../iam/embedded/index.ts';
import { startWorker } from '../temporal/worker.ts';

const options = JSON.parse(process.argv[2] ?? '{}') as {
  databaseUrl: string;
  address: string;
  taskQueue: string;
  maxCachedWorkflows?: number;
};
const log = createLogger({ level: 'warn', name: 'bench-worker' });
const { db } = createDb(options.databaseUrl, { max: 10, applicationName: 'bench-worker' });
const worker = await startWorker({
  db,
  log,
  iam: createEmbeddedIam({ db, log }),
  address: options.address,
  taskQueue: options.taskQueue,
  sweeper: false,
  ...(options.maxCachedWorkflows !== undefined ? { maxCachedWorkflows: options.maxCachedWorkflows } : {}),
});
process.on('message', async (message: { type: string }) => {
  if (message.type === 'stop') {
    await worker.stop();
    process.exit(0);
  }
  globalThis.gc?.();
  process.send!({ memory: process.memoryUsage(), cpu: process.cpuUsage() });
});
process.send!({ ready: true });
