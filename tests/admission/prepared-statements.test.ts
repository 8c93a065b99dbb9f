import { sql } from 'kysely';
import { beforeAll, describe, expect, it } from 'vitest';
import { preparedMarker } from '../../db/pool.ts';
import { useTestDatabase } from '../support/database.ts';

const t = useTestDatabase({ max: 1 });

beforeAll(async () => {
  await sql`CREATE TABLE prepared_probe (id int PRIMARY KEY)`.execute(t.db);
  await sql`INSERT INTO prepared_probe VALUES (1)`.execute(t.db);
});

const probe = () =>
  sql<
    Record<string, unknown>
  >`${sql.raw(preparedMarker)} SELECT * FROM prepared_probe WHERE id = ${1}`.execute(t.db);

describe('statements marked /*prepared*/ (db/pool.ts)', () => {
  it('run as named prepared statements on their connection', async () => {
    expect((await probe()).rows).toEqual([{ id: 1 }]);
    const { rows } = await sql<{ n: number }>`SELECT count(*)::int AS n FROM pg_prepared_statements`.execute(
      t.db,
    );
    expect(rows[0]!.n).toBe(1);
  });

  it('survive a column added under a prepared `*`: one call fails, the next prepares afresh', async () => {
    await sql`ALTER TABLE prepared_probe ADD COLUMN note text`.execute(t.db);
    await expect(probe()).rejects.toMatchObject({ code: '0A000' });
    expect((await probe()).rows).toEqual([{ id: 1, note: null }]);
  });
});
