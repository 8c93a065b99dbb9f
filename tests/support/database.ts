import { randomBytes } from 'node:crypto';
import { sql } from 'kysely';
import pg from 'pg';
import { expect, inject } from 'vitest';
import type { Db } from '../../core/database.ts';
import { createDb, type DbHandle } from '../../db/pool.ts';
import { useFixture } from './hooks.ts';

export interface TestDatabase extends DbHandle {
  url: string;
  name: string;
  /** Closes the pool and drops the database. */
  drop(): Promise<void>;
}

/**
 * A fresh, migrated database for one test file: a clone of the suite's template (fast, real
 * PostgreSQL, never a mock).
 */
export async function createTestDatabase(options: { max?: number } = {}): Promise<TestDatabase> {
  const adminUrl = inject('postgresAdminUrl');
  const template = inject('templateDatabase');
  const name = `bc_test_${randomBytes(6).toString('hex')}`;
  const admin = new pg.Client({ connectionString: adminUrl });
  await admin.connect();
  try {
    await admin.query(`CREATE DATABASE "${name}" TEMPLATE "${template}"`);
  } finally {
    await admin.end();
  }
  const url = new URL(adminUrl);
  url.pathname = `/${name}`;
  const handle = createDb(url.toString(), { max: options.max ?? 20 });
  return {
    ...handle,
    url: url.toString(),
    name,
    drop: async () => {
      await handle.close();
      const dropper = new pg.Client({ connectionString: adminUrl });
      await dropper.connect();
      await dropper.query(`DROP DATABASE IF EXISTS "${name}" WITH (FORCE)`).catch(() => {});
      await dropper.end();
    },
  };
}

/** A fresh database for the tests of the enclosing file or `describe` block, dropped after them. */
export function useTestDatabase(options: { max?: number } = {}): TestDatabase {
  return useFixture(
    () => createTestDatabase(options),
    (database) => database.drop(),
  );
}

/**
 * Waits until `count` sessions of the test database named `applicationName` wait on a lock (a
 * transaction blocked where the test means it to be), polling pg_stat_activity.
 */
export async function waitForSessionsOnLock(
  db: Db,
  applicationName: string,
  options: { count?: number; timeoutMs?: number } = {},
): Promise<void> {
  await expect
    .poll(
      async () => {
        const { rows } = await sql<{ n: number }>`
          SELECT count(*)::int AS n FROM pg_stat_activity
          WHERE datname = current_database() AND application_name = ${applicationName}
            AND wait_event_type = 'Lock'`.execute(db);
        return rows[0]!.n;
      },
      { timeout: options.timeoutMs ?? 30_000, interval: 50 },
    )
    .toBeGreaterThanOrEqual(options.count ?? 1);
}
