// An API process that dies between admission's commit and the workflow start: its lifecycle seam
// kills the process (SIGKILL) the moment admission calls `start`. Run by tests/lifecycle/sweeper.
// Usage: node --import tsx tests/lifecycle/api-crash-child.ts '<json options>'

import { parseConfig } from '../../core/config.ts';
import { createDb } from '../../db/pool.ts';
import { createEmbeddedIam } from '../../iam/embedded/index.ts';
import { createCompute } from '../../server/compute.ts';
import { testLogger } from '../support/logger.ts';

const options = JSON.parse(process.argv[2] ?? '{}') as { databaseUrl: string; token: string; poolId: string };
const log = testLogger();
const { db } = createDb(options.databaseUrl, { max: 2, applicationName: 'api-crash-child' });
const iam = createEmbeddedIam({ db, log });
const crash = async (): Promise<never> => {
  process.kill(process.pid, 'SIGKILL');
  throw new Error('unreachable: the process was killed');
};
const compute = createCompute({
  config: parseConfig({}),
  db,
  log,
  iam,
  lifecycle: { start: crash, signal: crash, wakePool: crash, running: crash },
});
await compute.api.reservations.create(
  { token: options.token },
  {
    tenantId: 'acme',
    poolId: options.poolId,
    devices: [{ class: 'gpu', count: 2 }],
    duration: '1h',
    idempotencyKey: 'crash-between-commit-and-start',
  },
);
process.stdout.write('not reached\n');
