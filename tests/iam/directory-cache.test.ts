import type { KyselyPlugin } from 'kysely';
import { beforeAll, describe, expect, it } from 'vitest';
import { iamDatabase } from '../../db/iam/iam-db.ts';
import { insertTenant } from '../../db/iam/tenants.ts';
import { createDirectory } from '../../iam/embedded/directory.ts';
import { useTestDatabase } from '../support/database.ts';

const t = useTestDatabase({ max: 5 });

/** A view of the test database that counts the statements run through it. */
function countingDb() {
  const counter = { statements: 0 };
  const plugin: KyselyPlugin = {
    transformQuery: (args) => {
      counter.statements++;
      return args.node;
    },
    transformResult: async (args) => args.result,
  };
  return { db: iamDatabase(t.db).withPlugin(plugin), counter };
}

beforeAll(async () => {
  await insertTenant(iamDatabase(t.db), { id: 'platform', name: 'Platform', parentId: null });
  await insertTenant(iamDatabase(t.db), { id: 'acme', name: 'Acme', parentId: 'platform' });
});

describe("the IAM directory's cache", () => {
  it('loads once for 50 concurrent callers that miss together, then answers from the cache', async () => {
    const { db, counter } = countingDb();
    const directory = createDirectory(db, { ttlMs: 60_000 });
    const chains = await Promise.all(Array.from({ length: 50 }, () => directory.chain('acme')));
    expect(counter.statements).toBe(1);
    for (const chain of chains) expect(chain.map((tenant) => tenant.id)).toEqual(['acme', 'platform']);
    await directory.chain('acme');
    expect(counter.statements).toBe(1);
  });

  it('does not keep what a load begun before an invalidation read', async () => {
    const { db, counter } = countingDb();
    const directory = createDirectory(db, { ttlMs: 60_000 });
    const before = directory.rootTenantId();
    directory.invalidate();
    await insertTenant(iamDatabase(t.db), { id: 'globex', name: 'Globex', parentId: 'platform' });
    const after = directory.chain('globex');
    expect(await before).toBe('platform');
    expect((await after).map((tenant) => tenant.id)).toEqual(['globex', 'platform']);
    // The load begun after the invalidation is its own; the one before it was not stored.
    expect(counter.statements).toBe(2);
    await directory.chain('globex');
    expect(counter.statements).toBe(2);
  });
});
