import pg from 'pg';
import { describe, expect, test } from 'vitest';
import { type BetterComputeOptions, betterCompute } from '../../index.ts';
import { createTestDatabase } from '../support/database.ts';

const database = 'postgres://127.0.0.1:5432/compute';

function refusal(options: unknown): string {
  try {
    betterCompute(options as BetterComputeOptions);
  } catch (error) {
    return (error as Error).message;
  }
  throw new Error('betterCompute accepted the options');
}

describe('betterCompute(options)', () => {
  test('a bad option throws an Error naming it, before anything is opened', () => {
    expect(refusal(undefined)).toBe('betterCompute: options must be an object with at least `database`');
    expect(refusal({})).toBe(
      'betterCompute: option database is invalid: expected a postgres:// URL, { url, max? } or a pg.Pool',
    );
    expect(refusal({ database: 'mysql://127.0.0.1/compute' })).toBe(
      'betterCompute: option database is invalid: expected a postgres:// or postgresql:// URL',
    );
    expect(refusal({ database, temporal: {} })).toMatch(
      /^betterCompute: option temporal\.address is invalid/,
    );
    expect(refusal({ database, secret: 'short' })).toBe(
      'betterCompute: option secret is invalid: at least 32 characters',
    );
    expect(refusal({ database, mode: 'everything' })).toMatch(/^betterCompute: option mode is invalid/);
    expect(refusal({ database, logger: console })).toMatch(
      /^betterCompute: option logger is invalid: a pino/,
    );
    expect(refusal({ database, databaseUrl: database })).toBe('betterCompute: unknown option databaseUrl');
    expect(refusal({ database, temporal: { address: 'x:7233', queue: 'q' } })).toBe(
      'betterCompute: unknown option temporal.queue',
    );
    expect(refusal({ database, iam: {} })).toMatch(/^betterCompute: option iam is not supported: /);
  });

  test("takes the embedder's own pg.Pool, serves on it, and leaves it open on stop()", async () => {
    const t = await createTestDatabase({ max: 1 });
    const pool = new pg.Pool({ connectionString: t.url, max: 2 });
    try {
      const compute = betterCompute({ database: pool, logLevel: 'silent' });
      const { rootAdminToken, migrationsApplied } = await compute.initialize();
      expect(migrationsApplied).toEqual([]);
      const whoami = await compute.api.system.whoami({ token: rootAdminToken }, {});
      expect(whoami.tenantId).toBe('platform');
      const health = await compute.handler(new Request('http://compute.test/healthz'));
      expect(health.status).toBe(200);
      await compute.stop();
      expect((await pool.query('SELECT 1 AS one')).rows).toEqual([{ one: 1 }]);
    } finally {
      await pool.end();
      await t.drop();
    }
  });
});
