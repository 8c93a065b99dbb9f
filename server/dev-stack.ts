import { mkdirSync, renameSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import pg from 'pg';
import type { Config } from '../core/config.ts';
import type { Logger } from '../core/logger.ts';
import { startLocalPostgres } from '../db/local-postgres.ts';
import { migrateToLatest } from '../db/migrate.ts';
import { createDb } from '../db/pool.ts';
import { devWebhookAllowHosts } from '../domain/webhook-target.ts';
import { defaultToolsDir, startTemporalDevServer, waitForTemporal } from '../temporal/dev-server.ts';
import { seedDevStack } from './dev-seed.ts';
import { startControlPlane } from './serve.ts';

/** What `.data/dev.json` holds, for scripts and the CLI. */
export interface DevStackInfo {
  apiUrl: string;
  temporalAddress: string;
  temporalUiUrl: string | null;
  databaseUrl: string;
  gatewayAddress: string | null;
  tenants: { root: { id: string; token: string }; acme: { id: string; token: string } };
  pools: Array<{ id: string; name: string; gpuModel: string; nodes: number; gpus: number }>;
}

export interface DevStack {
  info: DevStackInfo;
  stop(): Promise<void>;
}

async function checkDatabaseReachable(url: string) {
  const client = new pg.Client({ connectionString: url, connectionTimeoutMillis: 5_000 });
  try {
    await client.connect();
  } catch (error) {
    throw new Error(
      `DATABASE_URL is not reachable (${(error as Error).message}): start that PostgreSQL server or unset DATABASE_URL to use a private one`,
    );
  } finally {
    await client.end().catch(() => {});
  }
}

/**
 * The whole system on one machine: a private PostgreSQL (or DATABASE_URL), the Temporal dev
 * server with its Web UI (or TEMPORAL_ADDRESS), the control plane in mode `all`, the demo tenants
 * and pool, and `sim` simulated GPU servers running real bcd agents. Everything it started stops
 * again if a step fails, and on `stop()`.
 */
export async function startDevStack(options: {
  config: Config;
  log: Logger;
  sim: number;
}): Promise<DevStack> {
  const { config, log } = options;
  const dataDir = path.resolve(config.BETTER_COMPUTE_DATA_DIR);
  mkdirSync(dataDir, { recursive: true });
  const stops: Array<() => Promise<void>> = [];
  const stopAll = async () => {
    for (const stop of stops.reverse())
      await stop().catch((err) => log.warn({ err }, 'error while stopping'));
  };
  try {
    let databaseUrl = config.DATABASE_URL;
    if (databaseUrl) await checkDatabaseReachable(databaseUrl);
    else {
      const postgres = await startLocalPostgres({
        dataDir: path.join(dataDir, 'postgres'),
        database: 'better_compute',
        log,
      });
      stops.push(postgres.stop);
      databaseUrl = postgres.url;
    }
    const migrator = createDb(databaseUrl, { max: 1 });
    try {
      const { applied } = await migrateToLatest(migrator.db);
      if (applied.length) log.info({ applied }, 'migrations applied');
    } finally {
      await migrator.close();
    }

    let temporalAddress = config.TEMPORAL_ADDRESS;
    let temporalUiUrl: string | null = null;
    if (temporalAddress) await waitForTemporal(temporalAddress, 10_000);
    else {
      const temporal = await startTemporalDevServer({
        dataDir: path.join(dataDir, 'temporal'),
        toolsDir: config.BETTER_COMPUTE_TOOLS_DIR ?? defaultToolsDir(),
        log,
      });
      stops.push(temporal.stop);
      temporalAddress = temporal.address;
      temporalUiUrl = temporal.uiUrl;
    }

    // Webhooks to this machine over http are for development: the dev stack allows them unless told.
    const allowHosts = config.BETTER_COMPUTE_WEBHOOK_ALLOW_HOSTS ?? [...devWebhookAllowHosts];
    const planeConfig: Config = { ...config, BETTER_COMPUTE_WEBHOOK_ALLOW_HOSTS: allowHosts };
    const plane = await startControlPlane({
      mode: 'all',
      config: planeConfig,
      log,
      databaseUrl,
      temporalAddress,
    });
    stops.push(plane.stop);

    const demo = await seedDevStack({ plane, sim: options.sim, dataDir, log });
    stops.push(demo.stop);

    const info: DevStackInfo = {
      apiUrl: plane.apiUrl!,
      temporalAddress,
      temporalUiUrl,
      databaseUrl,
      gatewayAddress: plane.gateway?.address ?? null,
      tenants: demo.tenants,
      pools: demo.pools,
    };
    // Written whole and renamed into place, so a script waiting for dev.json never reads half of it.
    const devJson = path.join(dataDir, 'dev.json');
    writeFileSync(`${devJson}.tmp`, `${JSON.stringify(info, null, 2)}\n`, { mode: 0o600 });
    renameSync(`${devJson}.tmp`, devJson);
    return { info, stop: stopAll };
  } catch (error) {
    await stopAll();
    throw error;
  }
}
