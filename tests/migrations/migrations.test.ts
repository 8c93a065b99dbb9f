import { type Kysely, sql } from 'kysely';
import pg from 'pg';
import { afterAll, beforeAll, describe, expect, inject, it } from 'vitest';
import type { Db } from '../../core/database.ts';
import { migrateToLatest } from '../../db/migrate.ts';
import { createDb, type DbHandle } from '../../db/pool.ts';
import { migrations } from '../../migrations/index.ts';

let admin: pg.Client;
const created: string[] = [];

async function emptyDatabase(): Promise<DbHandle> {
  const name = `bc_test_migrations_${created.length}_${process.pid}`;
  await admin.query(`CREATE DATABASE "${name}"`);
  created.push(name);
  const url = new URL(inject('postgresAdminUrl'));
  url.pathname = `/${name}`;
  return createDb(url.toString(), { max: 2 });
}

async function tableNames(db: Db) {
  const { rows } = await sql<{ tablename: string }>`
    SELECT tablename FROM pg_tables WHERE schemaname NOT IN ('pg_catalog', 'information_schema')`.execute(db);
  return rows.map((r) => r.tablename);
}

beforeAll(async () => {
  admin = new pg.Client({ connectionString: inject('postgresAdminUrl') });
  await admin.connect();
});

afterAll(async () => {
  for (const name of created) await admin.query(`DROP DATABASE IF EXISTS "${name}" WITH (FORCE)`);
  await admin.end();
});

describe('migrations', () => {
  it('apply every migration to an empty database, then find nothing left to apply', async () => {
    const handle = await emptyDatabase();
    try {
      const first = await migrateToLatest(handle.db);
      expect(first.applied).toEqual(Object.keys(migrations));
      expect(await tableNames(handle.db)).toEqual(
        expect.arrayContaining(['device_bookings', 'reservations', 'nodes']),
      );
      const second = await migrateToLatest(handle.db);
      expect(second.applied).toEqual([]);
    } finally {
      await handle.close();
    }
  });

  it('leave the database exactly as it was when one of them fails', async () => {
    const handle = await emptyDatabase();
    try {
      const broken = {
        ...migrations,
        '2099-01-01T00-broken': {
          up: async (db: Kysely<unknown>) => {
            await sql`CREATE TABLE half_done (id int)`.execute(db);
            await sql`SELECT no_such_function()`.execute(db);
          },
        },
      };
      await expect(migrateToLatest(handle.db, { getMigrations: async () => broken })).rejects.toMatchObject({
        code: 'INTERNAL',
        message: expect.stringContaining('2099-01-01T00-broken failed and nothing was applied'),
      });
      const tables = await tableNames(handle.db);
      expect(tables.filter((t) => !t.startsWith('kysely_'))).toEqual([]);
      const { rows } = await sql<{ n: string }>`SELECT count(*) AS n FROM kysely_migration`.execute(
        handle.db,
      );
      expect(Number(rows[0]!.n)).toBe(0);
    } finally {
      await handle.close();
    }
  });
});
