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
import { seedDevMetal } from './dev-metal.ts';
import { devReleaseSigner, seedDevReleases } from './dev-releases.ts';
import { devDeploymentSecret } from './dev-secret.ts';
import { seedDevStack } from './dev-seed.ts';
import { startControlPlane } from './serve.ts';
import { startWatchdog, supervise } from './supervise.ts';

/** What `.data/dev.json` holds, for scripts and the CLI. */
export interface DevStackInfo {
  apiUrl: string;
  temporalAddress: string;
  temporalUiUrl: string | null;
  databaseUrl: string;
  gatewayAddress: string | null;
  tenants: { root: { id: string; token: string }; acme: { id: string; token: string } };
  pools: Array<{ id: string; name: string; gpuModel: string; nodes: number; gpus: number }>;
  /** The bcd release the simulated fleet runs (`current`) and a newer signed one ready to roll out. */
  releases: Array<{ id: string; version: string; current: boolean }>;
  /** The dev release signer's key file (for `releases sign`) and its pin. */
  releaseSigner: { keyFile: string; pin: string };
  /** The bare-metal site, its site agent's machines (node ids), and the demo profile (signed image). */
  sites: Array<{ id: string; name: string; machines: string[] }>;
  profiles: Array<{ id: string; name: string; version: number }>;
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
 * again if a step fails, and on `stop()`: the control plane first, then Temporal, then PostgreSQL.
 *
 * PostgreSQL and the Temporal dev server run in process groups of their own (a Ctrl-C reaches only
 * this process, which stops them in that order), are restarted at the same address when they die,
 * and are stopped by a watchdog should this process end without stopping them (even by SIGKILL).
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
  const watchdog = startWatchdog();
  stops.push(watchdog.stop);
  /** Registers a server with the watchdog as soon as it is spawned, and unregisters it once gone. */
  const watched = (signal: NodeJS.Signals) => (pid: number) => watchdog.watch(pid, signal);
  const unwatchOnExit = <T extends { pid: number; exited: Promise<unknown> }>(server: T): T => {
    void server.exited.then(() => watchdog.unwatch(server.pid));
    return server;
  };
  // Restarts say one line themselves; the servers' own start-up lines are for the first start.
  const quietLog = log.child({}, { level: 'warn' });
  try {
    let databaseUrl = config.DATABASE_URL;
    if (databaseUrl) await checkDatabaseReachable(databaseUrl);
    else {
      const startPostgres = (port: number | undefined, logger: Logger) =>
        startLocalPostgres({
          dataDir: path.join(dataDir, 'postgres'),
          database: 'better_compute',
          log: logger,
          detached: true,
          onSpawn: watched('SIGINT'),
          ...(port ? { port, strictPort: true } : {}),
        }).then(unwatchOnExit);
      const first = await startPostgres(undefined, log);
      const postgres = supervise({
        name: 'PostgreSQL',
        log,
        first,
        restart: () => startPostgres(first.port, quietLog),
      });
      stops.push(postgres.stop);
      databaseUrl = first.url;
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
      const startTemporal = (ports: { port: number; uiPort: number | null } | undefined, logger: Logger) =>
        startTemporalDevServer({
          dataDir: path.join(dataDir, 'temporal'),
          toolsDir: config.BETTER_COMPUTE_TOOLS_DIR ?? defaultToolsDir(),
          log: logger,
          detached: true,
          onSpawn: watched('SIGTERM'),
          ...(ports ? { port: ports.port, ...(ports.uiPort ? { uiPort: ports.uiPort } : {}) } : {}),
        }).then(unwatchOnExit);
      const first = await startTemporal(undefined, log);
      const temporal = supervise({
        name: 'the Temporal dev server',
        log,
        first,
        restart: () => startTemporal(first, quietLog),
      });
      stops.push(temporal.stop);
      temporalAddress = first.address;
      temporalUiUrl = first.uiUrl;
    }

    // Webhooks to this machine over http are for development: the dev stack allows them unless told.
    const allowHosts = config.BETTER_COMPUTE_WEBHOOK_ALLOW_HOSTS ?? [...devWebhookAllowHosts];
    const signer = devReleaseSigner(dataDir);
    const planeConfig: Config = {
      ...config,
      BETTER_COMPUTE_WEBHOOK_ALLOW_HOSTS: allowHosts,
      // BETTER_COMPUTE_SECRET if set, else the one generated into the data directory on first run.
      BETTER_COMPUTE_SECRET: config.BETTER_COMPUTE_SECRET ?? devDeploymentSecret(dataDir, log),
      // The dev release signer is pinned by the control plane and by every simulated bcd.
      BETTER_COMPUTE_RELEASE_PINS: [...config.BETTER_COMPUTE_RELEASE_PINS, signer.pin],
      // The same dev signer signs the demo image of the bare-metal site.
      BETTER_COMPUTE_IMAGE_SIGNER_PINS: [...config.BETTER_COMPUTE_IMAGE_SIGNER_PINS, signer.pin],
    };
    const plane = await startControlPlane({
      mode: 'all',
      config: planeConfig,
      log,
      databaseUrl,
      temporalAddress,
    });
    stops.push(plane.stop);

    const demo = await seedDevStack({
      plane,
      sim: options.sim,
      dataDir,
      log,
      releaseTrust: { pins: [signer.pin], threshold: 1 },
    });
    stops.push(demo.stop);
    const releases = await seedDevReleases({
      plane,
      dataDir,
      rootToken: demo.tenants.root.token,
      poolId: demo.pools[0]!.id,
      signer,
      log,
    });

    const metal = await seedDevMetal({
      plane,
      dataDir,
      rootToken: demo.tenants.root.token,
      signer,
      log,
      watchdog,
    });
    stops.push(metal.stop);

    const info: DevStackInfo = {
      apiUrl: plane.apiUrl!,
      temporalAddress,
      temporalUiUrl,
      databaseUrl,
      gatewayAddress: plane.gateway?.address ?? null,
      tenants: demo.tenants,
      pools: demo.pools,
      releases,
      releaseSigner: { keyFile: signer.keyFile, pin: signer.pin },
      sites: metal.sites,
      profiles: metal.profiles,
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
