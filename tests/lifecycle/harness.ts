import type { Client } from '@temporalio/client';
import { sql } from 'kysely';
import { parseConfig } from '../../core/config.ts';
import type { Db, ReservationState } from '../../core/database.ts';
import type { Logger } from '../../core/logger.ts';
import type { RegisteredNode } from '../../db/nodes/fleet.ts';
import type { LifecycleTimers } from '../../domain/reservation-lifecycle.ts';
import { bootstrapPlatform } from '../../iam/bootstrap.ts';
import { createEmbeddedIam, type EmbeddedIam } from '../../iam/embedded/index.ts';
import { type Compute, createCompute } from '../../server/compute.ts';
import type { RunningWorker } from '../../temporal/worker.ts';
import { createTestDatabase, type TestDatabase } from '../support/database.ts';
import { seedPool, smallShape } from '../support/fleet.ts';
import { useFixture } from '../support/hooks.ts';
import { tenantMember } from '../support/iam.ts';
import { testLogger } from '../support/logger.ts';
import { startTestTemporal, type TestTemporal } from '../support/temporal.ts';

export * from './reservations.ts';

/**
 * Short timers so every moment of a lifecycle happens within seconds. The bind timeout is the
 * exception: a test that reports a binding must not race it on a loaded machine (binding.test.ts,
 * which is about that timeout, sets a short one of its own).
 */
export const fastTimers: Partial<LifecycleTimers> = {
  bindTimeoutMs: 30_000,
  pendingRetryMs: 1_000,
  maxPendingMs: 60_000,
  preStartMs: 1_000,
  recheckMs: 30_000,
};

export interface LifecycleHarness {
  t: TestDatabase;
  db: Db;
  log: Logger;
  /** The embedded IAM the worker bills through. */
  iam: EmbeddedIam;
  tenantId: string;
  siteId: string;
  poolId: string;
  nodes: RegisteredNode[];
  taskQueue: string;
  address: string;
  temporal: { client: Client };
  lifecycle: TestTemporal['lifecycle'];
  worker: RunningWorker | null;
  /** Starts the in-process worker (when the harness began without one). */
  startWorker(): Promise<void>;
  /** Starts the lifecycle of a reservation of the harness's tenant and pool, as admission would. */
  startLifecycle(id: string, state?: string): Promise<void>;
  stop(): Promise<void>;
}

export interface LifecycleHarnessOptions {
  name: string;
  timers?: Partial<LifecycleTimers>;
  nodes?: number;
  worker?: boolean;
  activityTimeoutMs?: number;
  historyLimit?: number;
  /** Run the orphan-sweeper Schedule (a Schedule of this harness's own) every `everyMs`. */
  sweeper?: { everyMs: number; graceMs: number };
  /** Who owns the pool (default `tnt_root`) and the GPU quota it offers the tenant (default 64). */
  pool?: { ownerTenantId?: string; gpuQuota?: number };
}

/**
 * A real migrated database with a small fleet (nodes of two H100s), the embedded IAM as billing
 * ledger, a worker on a task queue of its own on the real Temporal dev server, and the lifecycle.
 */
export async function startLifecycleHarness(options: LifecycleHarnessOptions): Promise<LifecycleHarness> {
  const log = testLogger(`test-${options.name}`, 'warn');
  const t = await createTestDatabase();
  const tenantId = 'acme';
  const { siteId, poolId, nodes } = await seedPool(t.db, {
    site: `site-${options.name}`,
    ...(options.pool?.ownerTenantId ? { ownerTenantId: options.pool.ownerTenantId } : {}),
    nodes: options.nodes ?? 2,
    shape: smallShape,
    offers: { [tenantId]: { gpu: options.pool?.gpuQuota ?? 64 } },
  });
  const iam = createEmbeddedIam({ db: t.db, log });
  const temporal = await startTestTemporal({
    name: options.name,
    db: t.db,
    log,
    iam,
    timers: { ...fastTimers, ...options.timers },
    ...(options.worker === false ? { worker: false } : {}),
    ...(options.activityTimeoutMs ? { activityTimeoutMs: options.activityTimeoutMs } : {}),
    ...(options.historyLimit ? { historyLimit: options.historyLimit } : {}),
    ...(options.sweeper ? { sweeper: options.sweeper } : {}),
  });
  return {
    t,
    db: t.db,
    log,
    iam,
    tenantId,
    siteId,
    poolId,
    nodes,
    taskQueue: temporal.taskQueue,
    address: temporal.address,
    temporal: { client: temporal.client },
    lifecycle: temporal.lifecycle,
    get worker() {
      return temporal.worker;
    },
    set worker(worker) {
      temporal.worker = worker;
    },
    startWorker: () => temporal.startWorker(),
    startLifecycle: (id, state = 'placed') => temporal.lifecycle.start({ id, tenantId, poolId, state }),
    async stop() {
      await temporal.stop();
      await t.drop();
    },
  };
}

/** startLifecycleHarness for the tests of the enclosing file or `describe` block. */
export function useLifecycleHarness(options: LifecycleHarnessOptions): LifecycleHarness {
  return useFixture(
    () => startLifecycleHarness(options),
    (h) => h.stop(),
  );
}

export interface LifecycleApi extends LifecycleHarness {
  /** The API in process, starting and signalling the harness's lifecycles. */
  compute: Compute;
  /** A member of the harness's tenant. */
  credential: { token: string };
}

/** The harness with the platform bootstrapped, a member of its tenant, and the API in process. */
export function useLifecycleApi(options: LifecycleHarnessOptions): LifecycleApi {
  return useFixture(
    async () => {
      const h = await startLifecycleHarness(options);
      try {
        await bootstrapPlatform(h.iam);
        const { token } = await tenantMember(h.iam, h.tenantId, { name: 'ada' });
        const compute = createCompute({
          config: parseConfig({}),
          db: h.db,
          log: h.log,
          iam: h.iam,
          lifecycle: h.lifecycle,
          temporal: h.temporal.client,
        });
        return Object.assign(h, { compute, credential: { token } });
      } catch (error) {
        await h.stop();
        throw error;
      }
    },
    (h) => h.stop(),
  );
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

/** Whether the reservation's quota was charged and every charge of it is refunded. */
export async function quotaRefunded(h: LifecycleHarness, reservationId: string): Promise<boolean> {
  const rows = await h.db
    .selectFrom('quota_charges')
    .where('reservation_id', '=', reservationId)
    .select('refunded_at')
    .execute();
  return rows.length > 0 && rows.every((r) => r.refunded_at !== null);
}

/** The conditions stored on a reservation's row (what `reservations.get` shows). */
export async function reservationConditions(h: LifecycleHarness, reservationId: string): Promise<unknown> {
  const row = await h.db
    .selectFrom('reservations')
    .where('id', '=', reservationId)
    .select('conditions')
    .executeTakeFirstOrThrow();
  return row.conditions;
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

/** The payloads of the `wake` signals a lifecycle's history holds, as JSON text, oldest first. */
export async function wakeReasons(h: LifecycleHarness, reservationId: string): Promise<string[]> {
  const history = await h.temporal.client.workflow.getHandle(reservationId).fetchHistory();
  return (history.events ?? [])
    .map((e) => e.workflowExecutionSignaledEventAttributes)
    .filter((signal) => signal?.signalName === 'wake')
    .map((signal) => Buffer.from(signal?.input?.payloads?.[0]?.data ?? []).toString());
}

/**
 * The meters a reservation was billed on, once its lifecycle has ended (it writes the last window
 * as it ends the reservation), each meter once.
 */
export async function billedMeters(h: LifecycleHarness, reservationId: string): Promise<string[]> {
  await h.temporal.client.workflow.getHandle(reservationId).result();
  const rows = await h.db
    .selectFrom('usage_windows')
    .where('reservation_id', '=', reservationId)
    .select('meter')
    .distinct()
    .execute();
  return rows.map((r) => r.meter);
}
