import { randomBytes } from 'node:crypto';
import { sql } from 'kysely';
import { inject } from 'vitest';
import type { Db, ReservationState } from '../../core/database.ts';
import { createLogger } from '../../core/logger.ts';
import {
  insertPool,
  insertSite,
  type NodeShape,
  offerPool,
  type RegisteredNode,
  registerReadyNodes,
} from '../../db/nodes/fleet.ts';
import type { LifecycleTimers } from '../../domain/reservation-lifecycle.ts';
import { createEmbeddedIam } from '../../iam/embedded/index.ts';
import { connectTemporal, type TemporalClientHandle } from '../../temporal/client.ts';
import { createTemporalLifecycle } from '../../temporal/lifecycle.ts';
import { type RunningWorker, startWorker } from '../../temporal/worker.ts';
import { createTestDatabase, type TestDatabase } from '../support/database.ts';

export * from './reservations.ts';

export const smallShape: NodeShape = {
  gpus: 2,
  gpuModel: 'h100',
  gpuMemoryMiB: 81_559,
  nvlinkDomainSize: 2,
  numaNodes: 1,
  resources: {},
};

/** Short timers so every moment of a lifecycle happens within seconds. */
export const fastTimers: Partial<LifecycleTimers> = {
  bindTimeoutMs: 2_000,
  pendingRetryMs: 1_000,
  maxPendingMs: 60_000,
  preStartMs: 1_000,
  recheckMs: 30_000,
};

export interface LifecycleHarness {
  t: TestDatabase;
  db: Db;
  tenantId: string;
  siteId: string;
  poolId: string;
  nodes: RegisteredNode[];
  taskQueue: string;
  address: string;
  temporal: TemporalClientHandle;
  lifecycle: ReturnType<typeof createTemporalLifecycle>;
  worker: RunningWorker | null;
  /** Starts the in-process worker (when the harness began without one). */
  startWorker(): Promise<void>;
  /** Starts the lifecycle of a reservation of the harness's tenant and pool, as admission would. */
  startLifecycle(id: string, state?: string): Promise<void>;
  stop(): Promise<void>;
}

/**
 * A real migrated database with a small fleet (nodes of two H100s), the embedded IAM as billing
 * ledger, a worker on a task queue of its own on the real Temporal dev server, and the lifecycle.
 */
export async function startLifecycleHarness(options: {
  name: string;
  timers?: Partial<LifecycleTimers>;
  nodes?: number;
  worker?: boolean;
  activityTimeoutMs?: number;
  historyLimit?: number;
  /** Run the orphan-sweeper Schedule (a Schedule of this harness's own) every `everyMs`. */
  sweeper?: { everyMs: number; graceMs: number };
}): Promise<LifecycleHarness> {
  const log = createLogger({ level: 'warn', name: `test-${options.name}` });
  const t = await createTestDatabase();
  const tenantId = 'acme';
  const siteId = await insertSite(t.db, { name: `site-${options.name}`, region: 'eu-central-1' });
  const poolId = await insertPool(t.db, {
    siteId,
    ownerTenantId: 'tnt_root',
    name: 'h100',
    gpuModel: 'h100',
  });
  await offerPool(t.db, { poolId, tenantId, quota: { gpu: 64 } });
  const nodes = await registerReadyNodes(t.db, {
    siteId,
    poolId,
    count: options.nodes ?? 2,
    shape: smallShape,
  });
  const address = inject('temporalAddress');
  const taskQueue = `lifecycle-${options.name}-${randomBytes(4).toString('hex')}`;
  const timers = { ...fastTimers, ...options.timers };
  const temporal = await connectTemporal({ address });
  const iam = createEmbeddedIam({ db: t.db, log });
  const lifecycleOptions = {
    taskQueue,
    timers,
    ...(options.activityTimeoutMs ? { activityTimeoutMs: options.activityTimeoutMs } : {}),
    ...(options.historyLimit ? { historyLimit: options.historyLimit } : {}),
  };
  const startInProcessWorker = () =>
    startWorker({
      db: t.db,
      log,
      iam,
      address,
      taskQueue,
      timers,
      lifecycle: lifecycleOptions,
      sweeper: options.sweeper ? { ...options.sweeper, scheduleId: `sweeper-${taskQueue}` } : false,
    });
  const worker = options.worker === false ? null : await startInProcessWorker();
  const lifecycle = createTemporalLifecycle(temporal.client, lifecycleOptions);
  const harness: LifecycleHarness = {
    t,
    db: t.db,
    tenantId,
    siteId,
    poolId,
    nodes,
    taskQueue,
    address,
    temporal,
    lifecycle,
    worker,
    async startWorker() {
      harness.worker = await startInProcessWorker();
    },
    startLifecycle: (id, state = 'placed') => lifecycle.start({ id, tenantId, poolId, state }),
    async stop() {
      if (options.sweeper) {
        await temporal.client.schedule
          .getHandle(`sweeper-${taskQueue}`)
          .delete()
          .catch(() => {});
      }
      await harness.worker?.stop();
      await temporal.close();
      await t.drop();
    },
  };
  return harness;
}

/** What the gateway does with a node's `AllocationBound`: store the binding, then wake the workflow. */
export async function reportAllocation(
  h: LifecycleHarness,
  reservationId: string,
  allocationId: string,
  kind: 'bound' | 'failed' | 'released',
): Promise<void> {
  await h.db
    .updateTable('allocations')
    .set(
      kind === 'bound'
        ? {
            state: 'bound',
            bound_at: sql<Date>`compute_now()`,
            binding: JSON.stringify({
              cdiDevices: [`bcd.dev/gpu=${allocationId}`],
              envFile: `/run/bcd/allocations/${allocationId}.env`,
            }),
          }
        : { state: kind },
    )
    .where('id', '=', allocationId)
    .execute();
  await h.lifecycle.signal(reservationId, { type: 'allocationReport', allocationId, kind });
}

/** Polls the reservation until it is in `state` (or one of them). */
export async function waitForState(
  h: LifecycleHarness,
  reservationId: string,
  state: ReservationState | ReservationState[],
  timeoutMs = 20_000,
): Promise<{ state: ReservationState; end_reason: string | null; conditions: unknown[]; version: number }> {
  const wanted = Array.isArray(state) ? state : [state];
  const deadline = Date.now() + timeoutMs;
  let last:
    | { state: ReservationState; end_reason: string | null; conditions: unknown[]; version: number }
    | undefined;
  while (Date.now() < deadline) {
    last = await h.db
      .selectFrom('reservations')
      .where('id', '=', reservationId)
      .select(['state', 'end_reason', 'conditions', 'version'])
      .executeTakeFirstOrThrow();
    if (wanted.includes(last.state)) return last;
    await new Promise((r) => setTimeout(r, 100));
  }
  throw new Error(
    `reservation ${reservationId} is ${last?.state}, not ${wanted.join('|')}, after ${timeoutMs} ms`,
  );
}

/** The outbox event types of one reservation, in order. */
export async function eventTypes(h: LifecycleHarness, reservationId: string): Promise<string[]> {
  const rows = await h.db
    .selectFrom('outbox_events')
    .where('subject', '=', `reservation/${reservationId}`)
    .select('type')
    .orderBy('seq')
    .execute();
  return rows.map((r) => r.type);
}
