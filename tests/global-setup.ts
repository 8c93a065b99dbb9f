import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import pg from 'pg';
import type { TestProject } from 'vitest/node';
import { createLogger } from '../core/logger.ts';
import { startLocalPostgres } from '../db/local-postgres.ts';
import { migrateToLatest } from '../db/migrate.ts';
import { createDb } from '../db/pool.ts';
import { defaultToolsDir, startTemporalDevServer, waitForTemporal } from '../temporal/dev-server.ts';
import { testDeploymentSecret } from './support/secret.ts';

declare module 'vitest' {
  export interface ProvidedContext {
    /** A server URL (any database) with rights to create databases. */
    postgresAdminUrl: string;
    /** The migrated template each test file clones. */
    templateDatabase: string;
    temporalAddress: string;
    /** An empty data directory for the CLI's runs (tests/cli/run-cli.ts), removed at the end. */
    cliDataDir: string;
  }
}

/**
 * Starts what the suite needs, the same way the dev stack does: a private PostgreSQL (unless
 * DATABASE_URL names one) with a migrated template database, and the Temporal dev server (unless
 * TEMPORAL_ADDRESS names one).
 */
export default async function setup(project: TestProject) {
  const log = createLogger({ level: process.env.LOG_LEVEL ?? 'warn', name: 'test-setup' });
  const stops: Array<() => Promise<void>> = [];
  const dataRoot = path.resolve(process.env.BETTER_COMPUTE_DATA_DIR ?? '.data');
  // Child processes the tests start inherit it (fixtures in process set it themselves).
  process.env.BETTER_COMPUTE_SECRET ??= testDeploymentSecret;

  let adminUrl = process.env.DATABASE_URL;
  if (!adminUrl) {
    const server = await startLocalPostgres({
      // One cluster per run, so several runs (and the dev stack) never share a data directory.
      dataDir: path.join(dataRoot, `test-postgres-${process.pid}`),
      database: 'postgres',
      log,
      ephemeral: true,
    });
    stops.push(async () => {
      await server.stop();
      rmSync(server.dataDir, { recursive: true, force: true });
    });
    adminUrl = server.url;
  }

  const templateDatabase = `bc_template_${process.pid}`;
  const admin = new pg.Client({ connectionString: adminUrl });
  await admin.connect();
  await admin.query(`CREATE DATABASE "${templateDatabase}"`);
  const templateUrl = new URL(adminUrl);
  templateUrl.pathname = `/${templateDatabase}`;
  const template = createDb(templateUrl.toString(), { max: 1 });
  await migrateToLatest(template.db);
  await template.close();

  let temporalAddress = process.env.TEMPORAL_ADDRESS;
  if (temporalAddress) {
    await waitForTemporal(temporalAddress, 10_000);
  } else {
    const temporal = await startTemporalDevServer({
      dataDir: path.join(dataRoot, `test-temporal-${process.pid}`),
      toolsDir: process.env.BETTER_COMPUTE_TOOLS_DIR ?? defaultToolsDir(),
      log,
      headless: true,
      persist: false,
    });
    stops.push(async () => {
      await temporal.stop();
      rmSync(path.join(dataRoot, `test-temporal-${process.pid}`), { recursive: true, force: true });
    });
    temporalAddress = temporal.address;
  }

  project.provide('postgresAdminUrl', adminUrl);
  project.provide('templateDatabase', templateDatabase);
  project.provide('temporalAddress', temporalAddress);
  const cliDataDir = mkdtempSync(path.join(tmpdir(), 'bc-cli-'));
  stops.push(async () => rmSync(cliDataDir, { recursive: true, force: true }));
  project.provide('cliDataDir', cliDataDir);

  return async () => {
    await admin.query(`DROP DATABASE IF EXISTS "${templateDatabase}" WITH (FORCE)`).catch(() => {});
    await admin.end();
    for (const stop of stops.reverse()) await stop();
  };
}
