import { type ChildProcess, spawn } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { fileURLToPath } from 'node:url';
import { sql } from 'kysely';
import { inject } from 'vitest';
import { insertDeviceBookings } from '../../db/bookings.ts';
import {
  insertPool,
  insertSite,
  type NodeShape,
  offerPool,
  type RegisteredNode,
  registerReadyNodes,
} from '../../db/fleet.ts';
import type { Db } from '../../db/pool.ts';
import type { ReservationState } from '../../db/schema.ts';
import { newId } from '../../domain/ids.ts';
import type { LifecycleTimers } from '../../domain/reservation-lifecycle.ts';
import type { NormalizedRequest } from '../../domain/reservation-request.ts';
import { createEmbeddedIam } from '../../iam/embedded/index.ts';
import { createLogger } from '../../server/logger.ts';
import { connectTemporal, type TemporalClientHandle } from '../../temporal/client.ts';
import { createTemporalLifecycle } from '../../temporal/lifecycle.ts';
import { type RunningWorker, startWorker } from '../../temporal/worker.ts';
import { createTestDatabase, type TestDatabase } from '../support/database.ts';

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

/** A stored request in admission's normalized form. */
export function normalizedRequest(poolId: string, gpus: number, durationMs: number): NormalizedRequest {
  return {
    poolId,
    devices: [{ class: 'gpu', count: gpus, topology: 'any' }],
    duration: `${durationMs}ms`,
    durationMs,
    binding: 'hold',
  };
}

/**
 * A reservation as admission leaves it after its second transaction: placed on `node` (all its
 * GPUs) for `[start, start + durationMs)`, its quota charged, its `reservation.placed` event written.
 */
export async function insertPlacedReservation(
  h: LifecycleHarness,
  input: { node?: RegisteredNode; startInMs?: number; durationMs?: number; leaseSeconds?: number } = {},
): Promise<{ id: string; allocationId: string }> {
  const node = input.node ?? h.nodes[0]!;
  const id = newId('rsv');
  const allocationId = newId('alloc');
  await h.db.transaction().execute(async (trx) => {
    const { rows } = await sql<{ now: Date }>`SELECT compute_now() AS now`.execute(trx);
    const start = new Date(rows[0]!.now.getTime() + (input.startInMs ?? 0));
    const end = new Date(start.getTime() + (input.durationMs ?? 3_600_000));
    const during = `[${start.toISOString()},${end.toISOString()})`;
    await trx
      .insertInto('reservations')
      .values({
        id,
        tenant_id: h.tenantId,
        pool_id: h.poolId,
        owner_identity_id: 'idn_test',
        idempotency_key: id,
        request: JSON.stringify(
          normalizedRequest(h.poolId, node.deviceIds.length, end.getTime() - start.getTime()),
        ),
        request_hash: 'test',
        state: 'placed',
        duration_ms: end.getTime() - start.getTime(),
        during,
        lease_seconds: input.leaseSeconds ?? null,
        lease_expires_at: input.leaseSeconds
          ? sql<Date>`compute_now() + make_interval(secs => ${input.leaseSeconds})`
          : null,
      })
      .execute();
    await trx
      .insertInto('allocations')
      .values({
        id: allocationId,
        reservation_id: id,
        node_id: node.id,
        state: 'planned',
        during,
        resources: '{}',
      })
      .execute();
    await insertDeviceBookings(
      trx,
      node.deviceIds.map((deviceId) => ({ deviceId, allocationId, start, end })),
    );
    await trx
      .insertInto('quota_charges')
      .values({
        reservation_id: id,
        tenant_id: h.tenantId,
        pool_id: h.poolId,
        resource: 'gpu',
        amount: node.deviceIds.length,
      })
      .execute();
    await trx
      .updateTable('quotas')
      .set({ used: sql<string>`used + ${node.deviceIds.length}` })
      .where('tenant_id', '=', h.tenantId)
      .where('pool_id', '=', h.poolId)
      .where('resource', '=', 'gpu')
      .execute();
  });
  return { id, allocationId };
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

/** A reservation without a placement: `pending` (charged, Unschedulable) or `awaiting-confirmation`. */
export async function insertUnplacedReservation(
  h: LifecycleHarness,
  input: {
    state: 'pending' | 'awaiting-confirmation';
    confirmationExpiresInMs?: number;
    durationMs?: number;
    gpus?: number;
  },
): Promise<string> {
  const id = newId('rsv');
  await h.db
    .insertInto('reservations')
    .values({
      id,
      tenant_id: h.tenantId,
      pool_id: h.poolId,
      owner_identity_id: 'idn_test',
      idempotency_key: id,
      request: JSON.stringify(normalizedRequest(h.poolId, input.gpus ?? 2, input.durationMs ?? 3_600_000)),
      request_hash: 'test',
      state: input.state,
      duration_ms: input.durationMs ?? 3_600_000,
      pending_since: input.state === 'pending' ? sql<Date>`compute_now()` : null,
      conditions:
        input.state === 'pending'
          ? JSON.stringify([{ type: 'Unschedulable', reason: 'NoFit', message: 'nothing fits' }])
          : JSON.stringify([{ type: 'ConfirmationRequired', reason: 'cnf_test', message: 'waiting' }]),
      confirmation_id: input.state === 'awaiting-confirmation' ? 'cnf_test' : null,
      confirmation_expires_at:
        input.state === 'awaiting-confirmation'
          ? sql<Date>`compute_now() + make_interval(secs => ${(input.confirmationExpiresInMs ?? 60_000) / 1000})`
          : null,
    })
    .execute();
  return id;
}

/** Starts a worker in a child process on the harness's task queue; resolves once it polls. */
export async function spawnChildWorker(
  h: LifecycleHarness,
  options: { activityTimeoutMs?: number } = {},
): Promise<ChildProcess> {
  const child = spawn(
    process.execPath,
    [
      '--import',
      'tsx',
      fileURLToPath(new URL('./worker-child.ts', import.meta.url)),
      JSON.stringify({
        databaseUrl: h.t.url,
        address: h.address,
        taskQueue: h.taskQueue,
        timers: fastTimers,
        ...options,
      }),
    ],
    { stdio: ['ignore', 'pipe', 'inherit'] },
  );
  await new Promise<void>((resolve, reject) => {
    child.once('exit', (code) => reject(new Error(`the child worker exited with ${code}`)));
    child.stdout!.on('data', (chunk: Buffer) => {
      if (chunk.toString().includes('ready')) resolve();
    });
  });
  return child;
}

/** SIGKILLs a child and waits for it to be gone. */
export async function killChild(child: ChildProcess): Promise<void> {
  if (child.exitCode !== null || child.signalCode !== null) return;
  const exited = new Promise((resolve) => child.once('exit', resolve));
  child.kill('SIGKILL');
  await exited;
}
