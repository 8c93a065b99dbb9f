/**
 * The production shape against the single process, on the same machine: placements per second
 * (`reservations.create` answered `placed` through the HTTP API, `clients` at once for `seconds`)
 * and lifecycle starts per second (those reservations whose workflow was started, from the first
 * create until the last start), first on one `serve --mode all` process with the Temporal dev
 * server, then on the cluster (server/cluster.ts: a Temporal cluster of four services on
 * PostgreSQL, two API processes behind HAProxy, two workers, two gateways). Reservations start a
 * day ahead, so every workflow stays live on its timers and no agent is needed.
 * Usage: node --import tsx bench/cluster.ts [--seconds 20] [--clients 8]
 */
import { randomBytes } from 'node:crypto';
import { mkdtempSync, rmSync } from 'node:fs';
import os, { tmpdir } from 'node:os';
import path from 'node:path';
import { parseArgs } from 'node:util';
import { createComputeClient } from '../client/index.ts';
import type { Db } from '../core/database.ts';
import { createLogger } from '../core/logger.ts';
import { freePort, startLocalPostgres } from '../db/local-postgres.ts';
import { migrateToLatest } from '../db/migrate.ts';
import { insertPool, insertSite, offerPool, registerReadyNodes } from '../db/nodes/fleet.ts';
import { createDb } from '../db/pool.ts';
import { bootstrapPlatform } from '../iam/bootstrap.ts';
import { createEmbeddedIam } from '../iam/embedded/index.ts';
import { startCluster } from '../server/cluster.ts';
import { commandArgv, portAnswers, startClusterChild } from '../server/cluster-processes.ts';
import { startWatchdog } from '../server/supervise.ts';
import { defaultToolsDir, startTemporalDevServer } from '../temporal/dev-server.ts';
import { runLoad } from './support.ts';

const { values } = parseArgs({
  options: { seconds: { type: 'string', default: '20' }, clients: { type: 'string', default: '8' } },
});
const seconds = Number(values.seconds);
const clients = Number(values.clients);
const log = createLogger({ level: 'warn', name: 'bench' });
const toolsDir = process.env.BETTER_COMPUTE_TOOLS_DIR ?? defaultToolsDir();
const planeEnv = {
  BETTER_COMPUTE_SECRET: randomBytes(32).toString('base64url'),
  BETTER_COMPUTE_RATE_LIMIT_PER_TOKEN: '0',
  BETTER_COMPUTE_RATE_LIMIT_PER_TENANT: '0',
  LOG_LEVEL: 'warn',
};

/** A tenant with a token, and a pool of ready nodes offered to it, written straight to the database. */
async function seed(db: Db) {
  const iam = createEmbeddedIam({ db, log });
  await bootstrapPlatform(iam);
  await iam.admin.createTenant({ id: 'acme', name: 'acme' });
  const identity = await iam.admin.createIdentity({ tenantId: 'acme', kind: 'service', name: 'bench' });
  await iam.admin.bindRole({ identityId: identity.id, role: 'member' });
  const token = (await iam.admin.createToken({ identityId: identity.id })).token;
  const siteId = await insertSite(db, { name: 'bench', region: 'eu-central-1' });
  const poolId = await insertPool(db, { siteId, ownerTenantId: 'platform', name: 'h100', gpuModel: 'h100' });
  await registerReadyNodes(db, { siteId, poolId, count: 2_000 });
  await offerPool(db, { poolId, tenantId: 'acme', quota: { gpu: 1_000_000 } });
  return { token, poolId };
}

/** The load on `apiUrl`, then the wait until every lifecycle started. */
async function measure(shape: string, apiUrl: string, db: Db) {
  const { token, poolId } = await seed(db);
  const client = createComputeClient({ baseURL: apiUrl, token, retry: { attempts: 5 } });
  const start = Date.now() + 86_400_000;
  const t0 = performance.now();
  let firstError: string | null = null;
  const load = await runLoad(clients, seconds, async (worker, i) => {
    const r = await client.reservations
      .create({
        tenantId: 'acme',
        poolId,
        devices: [{ class: 'gpu', count: 1 }],
        duration: '1h',
        start,
        // Keys are printable ASCII without spaces.
        idempotencyKey: `${shape.replaceAll(' ', '-')}-${worker}-${i}`,
      })
      .catch((error: unknown) => {
        firstError ??= error instanceof Error ? error.message : String(error);
        throw error;
      });
    return r.state === 'placed' || r.state === 'pending';
  });
  if (firstError) console.error(`${shape}: first error: ${firstError}`);
  const count = async () => {
    const row = await db
      .selectFrom('reservations')
      .where('lifecycle_started_at', 'is not', null)
      .select((eb) => eb.fn.countAll<number>().as('n'))
      .executeTakeFirstOrThrow();
    return Number(row.n);
  };
  // wall time: until the last lifecycle of the load started (at most a minute after it)
  const deadline = Date.now() + 60_000;
  while ((await count()) < load.committed && Date.now() < deadline)
    await new Promise((r) => setTimeout(r, 200));
  const started = await count();
  const startSeconds = (performance.now() - t0) / 1000;
  return {
    shape,
    placementsPerSecond: load.perSecond,
    p50Ms: load.p50Ms,
    p99Ms: load.p99Ms,
    errors: load.errors,
    lifecyclesStarted: started,
    lifecycleStartsPerSecond: started / startSeconds,
    loadAverage: os
      .loadavg()
      .map((l) => l.toFixed(1))
      .join(' '),
  };
}

async function single() {
  const dir = mkdtempSync(path.join(tmpdir(), 'bc-bench-single-'));
  const watchdog = startWatchdog();
  const postgres = await startLocalPostgres({ dataDir: path.join(dir, 'postgres'), database: 'bench', log });
  const temporal = await startTemporalDevServer({
    dataDir: path.join(dir, 'temporal'),
    toolsDir,
    log,
    headless: true,
    persist: false,
  });
  const handle = createDb(postgres.url, { max: 4 });
  try {
    await migrateToLatest(handle.db);
    const apiPort = await freePort();
    const env = {
      ...process.env,
      ...planeEnv,
      DATABASE_URL: postgres.url,
      TEMPORAL_ADDRESS: temporal.address,
      BETTER_COMPUTE_API_PORT: String(apiPort),
      BETTER_COMPUTE_GATEWAY_PORT: String(await freePort()),
      LOG_FORMAT: 'json',
    };
    const logFile = path.join(dir, 'all.log');
    const plane = await startClusterChild({
      name: 'all',
      argv: commandArgv('better-compute serve --mode all', env),
      env,
      logFile,
      watchdog,
      // LOG_LEVEL is warn (no "API listening" line): ready once its port answers.
      ready: () => portAnswers(apiPort),
    });
    try {
      return await measure('single process', `http://127.0.0.1:${apiPort}`, handle.db);
    } finally {
      await plane.stop();
    }
  } finally {
    await handle.close();
    await temporal.stop();
    await postgres.stop();
    await watchdog.stop();
    rmSync(dir, { recursive: true, force: true });
  }
}

async function cluster() {
  const dir = mkdtempSync(path.join(tmpdir(), 'bc-bench-cluster-'));
  const started = await startCluster({
    log,
    dataDir: dir,
    toolsDir,
    env: { PATH: process.env.PATH, HOME: process.env.HOME },
    planeEnv,
  });
  const handle = createDb(started.databaseUrl, { max: 4 });
  try {
    return await measure('cluster', started.apiUrl, handle.db);
  } finally {
    await handle.close();
    await started.stop();
    rmSync(dir, { recursive: true, force: true });
  }
}

const results = [await single(), await cluster()];
console.table(results);
const [one, many] = results as [Awaited<ReturnType<typeof single>>, Awaited<ReturnType<typeof cluster>>];
console.log(
  JSON.stringify({
    seconds,
    clients,
    placementsRatio: (many.placementsPerSecond / one.placementsPerSecond).toFixed(2),
    lifecycleStartsRatio: (many.lifecycleStartsPerSecond / one.lifecycleStartsPerSecond).toFixed(2),
  }),
);
