import { randomBytes } from 'node:crypto';
import { rmSync } from 'node:fs';
import path from 'node:path';
import type { Client } from '@temporalio/client';
import type { Db } from '../../core/database.ts';
import type { Logger } from '../../core/logger.ts';
import { type SimulatedFleet, startSimulatedFleet } from '../../daemon/sim.ts';
import { type LocalPostgres, startLocalPostgres } from '../../db/local-postgres.ts';
import { migrateToLatest } from '../../db/migrate.ts';
import { createJoinToken } from '../../db/nodes/join-tokens.ts';
import { createDb, type DbHandle } from '../../db/pool.ts';
import type { LifecycleTimers } from '../../domain/reservation-lifecycle.ts';
import { bootstrapPlatform } from '../../iam/bootstrap.ts';
import { createEmbeddedIam } from '../../iam/embedded/index.ts';
import { startWatchdog, type Watchdog } from '../../server/supervise.ts';
import { connectTemporal, type TemporalClientHandle } from '../../temporal/client.ts';
import {
  defaultToolsDir,
  startTemporalDevServer,
  type TemporalDevServer,
} from '../../temporal/dev-server.ts';
import { eventually } from './eventually.ts';
import { seedPool } from './fleet.ts';
import { type TenantMember, tenantMember } from './iam.ts';
import { testLogger } from './logger.ts';
import { PlaneChild } from './plane-children.ts';
import { makeStackDir } from './temp-dir.ts';

/** Short timers, so binding, billing windows and the sweep all happen within seconds. */
export const faultTimers: Partial<LifecycleTimers> = {
  bindTimeoutMs: 20_000,
  pendingRetryMs: 1_000,
  maxPendingMs: 120_000,
  preStartMs: 1_000,
  recheckMs: 5_000,
  usageWindowMs: 5_000,
};

/**
 * The whole system with every part a test can kill: a private PostgreSQL cluster and a private
 * Temporal dev server (persisted to disk, so a restart keeps its workflows and Schedules), the API,
 * the worker (with the orphan sweeper) and the gateway each in a child process, and `nodes`
 * simulated bcd agents (8 GPUs each) in this process. Every server runs in a process group of its
 * own registered with a watchdog, so none outlives the test process.
 */
export interface FaultStack {
  log: Logger;
  dir: string;
  postgres: LocalPostgres;
  temporal: TemporalDevServer;
  /** This process's pool on the private database (checks and seeding). */
  db: Db;
  temporalClient: Client;
  api: PlaneChild;
  worker: PlaneChild;
  gateway: PlaneChild;
  fleet: SimulatedFleet;
  poolId: string;
  acme: TenantMember;
  apiUrl(): string;
  /** SIGKILLs PostgreSQL (its whole process group: a crash) and waits until it is gone. */
  killPostgres(): Promise<void>;
  /** Starts PostgreSQL again on its port and data directory (crash recovery runs). */
  startPostgres(): Promise<void>;
  /** SIGKILLs the Temporal dev server and waits until it is gone. */
  killTemporal(): Promise<void>;
  /** Starts the Temporal dev server again on its port, with its workflows. */
  startTemporal(): Promise<void>;
  stop(): Promise<void>;
}

async function killGroup(server: { pid: number; exited: Promise<unknown> }) {
  try {
    process.kill(-server.pid, 'SIGKILL');
  } catch {
    // already gone
  }
  await server.exited;
}

export async function startFaultStack(input: { nodes: number }): Promise<FaultStack> {
  const log = testLogger('faults', process.env.LOG_LEVEL ?? 'silent');
  const dir = makeStackDir('bc-faults-');
  const watchdog: Watchdog = startWatchdog();
  const stops: Array<() => Promise<void>> = [];
  const stopAll = async () => {
    for (const stop of stops.reverse()) await stop().catch(() => {});
    await watchdog.stop();
    rmSync(dir, { recursive: true, force: true });
  };
  try {
    const startPg = (port?: number) =>
      startLocalPostgres({
        dataDir: path.join(dir, 'postgres'),
        database: 'faults',
        log,
        // Not ephemeral: an answered commit must survive the crash this test injects.
        detached: true,
        onSpawn: (pid) => watchdog.watch(pid, 'SIGKILL'),
        ...(port ? { port, strictPort: true } : {}),
      });
    let postgres = await startPg();
    stops.push(() => postgres.stop());
    const handle: DbHandle = createDb(postgres.url, { max: 6, applicationName: 'fault-test' });
    stops.push(handle.close);
    await migrateToLatest(handle.db);

    const startTemporal = (port?: number) =>
      startTemporalDevServer({
        dataDir: path.join(dir, 'temporal'),
        toolsDir: process.env.BETTER_COMPUTE_TOOLS_DIR ?? defaultToolsDir(),
        log,
        headless: true,
        persist: true,
        detached: true,
        onSpawn: (pid) => watchdog.watch(pid, 'SIGKILL'),
        ...(port ? { port } : {}),
      });
    let temporal = await startTemporal();
    stops.push(() => temporal.stop());
    const temporalHandle: TemporalClientHandle = await connectTemporal({ address: temporal.address });
    stops.push(temporalHandle.close);

    const iam = createEmbeddedIam({ db: handle.db, log });
    await bootstrapPlatform(iam);
    const acme = await tenantMember(iam, 'acme');
    const { poolId } = await seedPool(handle.db, {
      ownerTenantId: 'platform',
      site: 'faults-site',
      offers: { acme: { gpu: 1_000 } },
    });

    const taskQueue = `faults-${randomBytes(4).toString('hex')}`;
    const common = {
      databaseUrl: postgres.url,
      temporalAddress: temporal.address,
      taskQueue,
      timers: faultTimers,
      activityTimeoutMs: 5_000,
      env: {
        // The load must never meet the rate limits: they are not what this test is about.
        BETTER_COMPUTE_RATE_LIMIT_PER_TOKEN: '0',
        BETTER_COMPUTE_RATE_LIMIT_PER_TENANT: '0',
        BETTER_COMPUTE_SECRET: randomBytes(32).toString('base64url'),
        BETTER_COMPUTE_GATEWAY_LEASE_SECONDS: '10',
      },
    };
    const worker = new PlaneChild(
      {
        ...common,
        role: 'worker',
        sweeper: { everyMs: 2_000, graceMs: 2_000, scheduleId: `sweeper-${taskQueue}` },
      },
      watchdog,
    );
    const api = new PlaneChild({ ...common, role: 'api' }, watchdog);
    const gateway = new PlaneChild({ ...common, role: 'gateway' }, watchdog);
    for (const child of [worker, api, gateway]) stops.push(() => child.kill());
    await Promise.all([worker.start(), api.start(), gateway.start()]);

    const { token } = await createJoinToken(handle.db, { poolId, ttlSeconds: 600, maxUses: input.nodes });
    const fleet = await startSimulatedFleet({
      gatewayAddress: gateway.info.address!,
      caCertificatePem: gateway.info.caCertificatePem!,
      joinToken: token,
      nodes: input.nodes,
      rootDir: path.join(dir, 'nodes'),
      log,
      minBackoffMs: 100,
      maxBackoffMs: 1_000,
    });
    stops.push(fleet.stop);
    await eventually(async () => {
      const ready = await handle.db
        .selectFrom('nodes')
        .where('pool_id', '=', poolId)
        .where('provision_state', '=', 'ready')
        .select((eb) => eb.fn.countAll<number>().as('n'))
        .executeTakeFirstOrThrow();
      return Number(ready.n) === input.nodes;
    }, 60_000);

    return {
      log,
      dir,
      get postgres() {
        return postgres;
      },
      get temporal() {
        return temporal;
      },
      db: handle.db,
      temporalClient: temporalHandle.client,
      api,
      worker,
      gateway,
      fleet,
      poolId,
      acme,
      apiUrl: () => api.info.url!,
      killPostgres: () => killGroup(postgres),
      async startPostgres() {
        // The old server's shared memory may take a moment to go: try until it starts.
        postgres = await eventually(() => startPg(postgres.port), 60_000);
      },
      killTemporal: () => killGroup(temporal),
      async startTemporal() {
        temporal = await eventually(() => startTemporal(temporal.port), 60_000);
      },
      stop: stopAll,
    };
  } catch (error) {
    await stopAll();
    throw error;
  }
}
