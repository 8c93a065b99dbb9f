import { fileURLToPath } from 'node:url';
import type { TLSConfig } from '@temporalio/client';
import {
  bundleWorkflowCode,
  type LogLevel,
  type LogMetadata,
  NativeConnection,
  Runtime,
  Worker,
  type WorkflowBundleWithSourceMap,
} from '@temporalio/worker';
import { createBookingRepairActivities } from '../activities/booking-repair.ts';
import { createDraftCleanupActivities } from '../activities/draft-cleanup.ts';
import { createGangActivities } from '../activities/gang.ts';
import { createMetalActivities } from '../activities/metal.ts';
import { createOperatorSignalActivities } from '../activities/operator-signals.ts';
import { createPlacementActivities } from '../activities/placement.ts';
import { createPreemptionActivities } from '../activities/preemption.ts';
import { createReportActivities } from '../activities/reports.ts';
import { createReservationActivities } from '../activities/reservation.ts';
import { createRolloutActivities } from '../activities/rollout.ts';
import { createSweeperActivities } from '../activities/sweeper.ts';
import { createUsageActivities } from '../activities/usage.ts';
import { createAdmissionCaches } from '../core/admission-caches.ts';
import type { Db } from '../core/database.ts';
import type { IamPort } from '../core/iam-port.ts';
import type { Logger } from '../core/logger.ts';
import type { LifecycleTimers } from '../domain/reservation-lifecycle.ts';
import { connectTemporal } from './client.ts';
import { createTemporalLifecycle } from './lifecycle.ts';
import { type PoolPlacer, type PoolPlacerOptions, startPoolPlacer } from './pool-placer.ts';
import { ensureSweeperSchedule, sweeperScheduleId } from './schedules.ts';

// Beside this module: workflows/index.ts from the sources (tsx), workflows/index.js in the built package.
export const workflowsPath = fileURLToPath(
  new URL(`../workflows/index${import.meta.url.endsWith('.ts') ? '.ts' : '.js'}`, import.meta.url),
);

let bundle: Promise<WorkflowBundleWithSourceMap> | null = null;

/** The workflow bundle, built once per process (webpack takes a few seconds). */
export function workflowBundle(): Promise<WorkflowBundleWithSourceMap> {
  bundle ??= bundleWorkflowCode({ workflowsPath, logger: quietBundlerLogger });
  return bundle;
}

const quietBundlerLogger = {
  log: () => {},
  trace: () => {},
  debug: () => {},
  info: () => {},
  warn: () => {},
  error: (message: string, meta?: Record<string, unknown>) => console.error(message, meta ?? ''),
};

/**
 * Routes the Temporal runtime's logs (the SDK's and the workflows' replay-aware logger) to pino,
 * once per process; a runtime installed earlier by the host process is left as it is.
 */
export function installTemporalRuntime(log: Logger): void {
  if (Runtime._instance) return;
  const pinoLevel: Record<LogLevel, 'trace' | 'debug' | 'info' | 'warn' | 'error'> = {
    TRACE: 'trace',
    DEBUG: 'debug',
    INFO: 'info',
    WARN: 'warn',
    ERROR: 'error',
  };
  const temporalLog = log.child({ component: 'temporal' });
  const write = (level: LogLevel, message: string, meta?: LogMetadata) =>
    temporalLog[pinoLevel[level]]({ ...meta }, message);
  Runtime.install({
    logger: {
      log: write,
      trace: (m, meta) => write('TRACE', m, meta),
      debug: (m, meta) => write('DEBUG', m, meta),
      info: (m, meta) => write('INFO', m, meta),
      warn: (m, meta) => write('WARN', m, meta),
      error: (m, meta) => write('ERROR', m, meta),
    },
  });
}

export interface WorkerDeps {
  db: Db;
  log: Logger;
  /** Billing, and (when present) the administration a `confirm` signal decides through. */
  iam: Pick<IamPort, 'recordUsage'> & Partial<Pick<IamPort, 'admin'>>;
  /** The Temporal frontend, e.g. 127.0.0.1:7233. */
  address: string;
  namespace?: string;
  /** TLS to the frontend (`temporalTls(config)`). */
  tls?: TLSConfig;
  taskQueue: string;
  /** Timer overrides for workflows this process starts (tests use seconds). */
  timers?: Partial<LifecycleTimers>;
  /** How the lifecycles this worker's sweeper starts are configured (besides `timers`). */
  lifecycle?: { historyLimit?: number; activityTimeoutMs?: number };
  /** The orphan sweeper's Schedule; `false` leaves it alone (tests that drive the sweep by hand). */
  sweeper?: false | { everyMs?: number; graceMs?: number; scheduleId?: string };
  /** How long the sweeper keeps refused requests before it removes them (default 24). */
  draftRetentionHours?: number;
  /**
   * Most activities run at once, and most local activities (a lifecycle's short steps) besides:
   * each holds one PostgreSQL connection while it runs.
   */
  maxConcurrentActivities?: number;
  /**
   * Most workflows kept in the sticky cache (default `defaultWorkflowCache`). An evicted lifecycle
   * is replayed from its history when it next wakes; fewer cached costs less memory.
   */
  maxCachedWorkflows?: number;
  /** The pool-lease placer's loop in this process (temporal/pool-placer.ts); `false` runs none. */
  poolPlacer?: false | PoolPlacerOptions;
}

/**
 * The sticky cache's default size. The SDK's own default grows with the heap limit (about 2,000
 * with a 4 GiB heap), so a worker kept every live lifecycle and its RSS grew by about 320 MiB per
 * 1,000 of them; at 250 it grows by about 170 MiB, and a lifecycle woken after its eviction replays
 * its short history first (bench/README.md measures both).
 */
export const defaultWorkflowCache = 250;

export interface RunningWorker {
  worker: Worker;
  /** This process's pool-lease placer, unless `poolPlacer: false`. */
  poolPlacer: PoolPlacer | null;
  stop(): Promise<void>;
}

/**
 * Starts the Temporal worker that hosts the lifecycle workflows and their activities on
 * `taskQueue`, and makes sure the orphan-sweeper Schedule exists. `stop` drains and closes it.
 */
export async function startWorker(deps: WorkerDeps): Promise<RunningWorker> {
  const log = deps.log.child({ component: 'worker', taskQueue: deps.taskQueue });
  const namespace = deps.namespace ?? 'default';
  installTemporalRuntime(deps.log);
  const temporal = await connectTemporal({
    address: deps.address,
    namespace,
    ...(deps.tls ? { tls: deps.tls } : {}),
  });
  let connection: NativeConnection;
  try {
    connection = await NativeConnection.connect({
      address: deps.address,
      ...(deps.tls ? { tls: deps.tls } : {}),
    });
  } catch (error) {
    await temporal.close();
    throw error;
  }
  const lifecycle = {
    ...deps.lifecycle,
    taskQueue: deps.taskQueue,
    ...(deps.timers ? { timers: deps.timers } : {}),
  };
  const caches = createAdmissionCaches();
  const activities = {
    ...createReservationActivities({ db: deps.db, log }),
    ...createPlacementActivities({
      db: deps.db,
      log,
      caches,
      lifecycle: createTemporalLifecycle(temporal.client, lifecycle),
    }),
    ...createPreemptionActivities({ db: deps.db, log }),
    ...createGangActivities({ db: deps.db, log }),
    ...createBookingRepairActivities({ db: deps.db, log, caches }),
    ...createReportActivities({ db: deps.db, log }),
    ...createRolloutActivities({
      db: deps.db,
      log,
      temporal: { client: temporal.client, taskQueue: deps.taskQueue },
    }),
    ...createMetalActivities({ db: deps.db, log }),
    ...createUsageActivities({ db: deps.db, log, iam: deps.iam }),
    ...createSweeperActivities({
      db: deps.db,
      log,
      lifecycle: createTemporalLifecycle(temporal.client, lifecycle),
    }),
    ...createDraftCleanupActivities({ db: deps.db, log }),
    ...createOperatorSignalActivities({ db: deps.db, log, temporal: temporal.client, iam: deps.iam }),
  };
  const worker = await Worker.create({
    connection,
    namespace,
    taskQueue: deps.taskQueue,
    workflowBundle: await workflowBundle(),
    activities,
    maxConcurrentActivityTaskExecutions: deps.maxConcurrentActivities ?? 50,
    maxConcurrentLocalActivityExecutions: deps.maxConcurrentActivities ?? 50,
    maxCachedWorkflows: deps.maxCachedWorkflows ?? defaultWorkflowCache,
  });
  if (deps.sweeper !== false) {
    await ensureSweeperSchedule(temporal.client, {
      taskQueue: deps.taskQueue,
      scheduleId: deps.sweeper?.scheduleId ?? sweeperScheduleId,
      ...(deps.sweeper?.everyMs ? { everyMs: deps.sweeper.everyMs } : {}),
      ...(deps.sweeper?.graceMs ? { graceMs: deps.sweeper.graceMs } : {}),
      draftRetentionMs: (deps.draftRetentionHours ?? 24) * 3_600_000,
    });
  }
  const running = worker.run();
  running.catch((error) => log.error({ err: error }, 'the Temporal worker stopped'));
  log.info({ address: deps.address, namespace }, 'Temporal worker is polling');
  const poolPlacer =
    deps.poolPlacer === false
      ? null
      : startPoolPlacer(
          { db: deps.db, log, caches, lifecycle: createTemporalLifecycle(temporal.client, lifecycle) },
          deps.poolPlacer ?? {},
        );
  return {
    worker,
    poolPlacer,
    async stop() {
      await poolPlacer?.stop();
      if (worker.getState() === 'RUNNING') worker.shutdown();
      await running.catch(() => {});
      await connection.close();
      await temporal.close();
    },
  };
}
