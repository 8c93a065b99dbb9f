import { randomBytes } from 'node:crypto';
import type { Client } from '@temporalio/client';
import { inject } from 'vitest';
import type { Db } from '../../core/database.ts';
import type { IamPort } from '../../core/iam-port.ts';
import type { Logger } from '../../core/logger.ts';
import type { LifecycleTimers } from '../../domain/reservation-lifecycle.ts';
import { connectTemporal } from '../../temporal/client.ts';
import { createTemporalLifecycle } from '../../temporal/lifecycle.ts';
import type { PoolPlacerOptions } from '../../temporal/pool-placer.ts';
import { type RunningWorker, startWorker } from '../../temporal/worker.ts';

export interface TestTemporal {
  /** The suite's Temporal dev server. */
  address: string;
  /** A task queue of this fixture's own, so test files never take each other's tasks. */
  taskQueue: string;
  client: Client;
  lifecycle: ReturnType<typeof createTemporalLifecycle>;
  worker: RunningWorker | null;
  /** Starts the in-process worker (when the fixture began without one). */
  startWorker(): Promise<void>;
  stop(): Promise<void>;
}

/**
 * The real Temporal dev server of the suite: a client, the lifecycle on a task queue named after
 * `name`, and an in-process worker on it (unless `worker: false`). The orphan sweeper's Schedule
 * runs only when `sweeper` asks for it, under a Schedule id of this fixture's own.
 */
export async function startTestTemporal(input: {
  name: string;
  db: Db;
  log: Logger;
  iam: Pick<IamPort, 'recordUsage'>;
  timers: Partial<LifecycleTimers>;
  worker?: boolean;
  activityTimeoutMs?: number;
  historyLimit?: number;
  sweeper?: { everyMs: number; graceMs: number };
  /** The in-process worker's pool-lease placer (default: on, with its default lease). */
  poolPlacer?: false | PoolPlacerOptions;
}): Promise<TestTemporal> {
  const address = inject('temporalAddress');
  const taskQueue = `lifecycle-${input.name}-${randomBytes(4).toString('hex')}`;
  const lifecycleOptions = {
    taskQueue,
    timers: input.timers,
    ...(input.activityTimeoutMs ? { activityTimeoutMs: input.activityTimeoutMs } : {}),
    ...(input.historyLimit ? { historyLimit: input.historyLimit } : {}),
  };
  const sweeperScheduleId = `sweeper-${taskQueue}`;
  const temporal = await connectTemporal({ address });
  const startInProcessWorker = () =>
    startWorker({
      db: input.db,
      log: input.log,
      iam: input.iam,
      address,
      taskQueue,
      timers: input.timers,
      lifecycle: lifecycleOptions,
      sweeper: input.sweeper ? { ...input.sweeper, scheduleId: sweeperScheduleId } : false,
      ...(input.poolPlacer !== undefined ? { poolPlacer: input.poolPlacer } : {}),
    });
  const fixture: TestTemporal = {
    address,
    taskQueue,
    client: temporal.client,
    lifecycle: createTemporalLifecycle(temporal.client, lifecycleOptions),
    worker: input.worker === false ? null : await startInProcessWorker(),
    async startWorker() {
      fixture.worker = await startInProcessWorker();
    },
    async stop() {
      if (input.sweeper) {
        await temporal.client.schedule
          .getHandle(sweeperScheduleId)
          .delete()
          .catch(() => {});
      }
      await fixture.worker?.stop();
      await temporal.close();
    },
  };
  return fixture;
}
