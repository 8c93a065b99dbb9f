import { sql } from 'kysely';
import type { Db } from '../../core/database.ts';

/**
 * Every table of the `public` and `iam` schemas as its row count and a checksum of its rows, to
 * show that a batch of calls changed nothing: compare a snapshot taken before with one after.
 * `last_used_at` is left out: it records that a token authenticated, which happens before any
 * refusal.
 */
export async function tableSnapshot(db: Db): Promise<Record<string, string>> {
  const tables = (
    await sql<{ name: string }>`
      SELECT quote_ident(table_schema) || '.' || quote_ident(table_name) AS name
      FROM information_schema.tables
      WHERE table_schema IN ('public', 'iam') AND table_type = 'BASE TABLE'
      ORDER BY 1`.execute(db)
  ).rows.map((r) => r.name);
  const parts = tables.map(
    (
      name,
    ) => `SELECT '${name}' AS name, count(*) || ':' || md5(coalesce(string_agg(r, E'\\n' ORDER BY r), '')) AS sum
       FROM (SELECT (to_jsonb(t) - 'last_used_at')::text AS r FROM ${name} t) q`,
  );
  const { rows } = await sql<{ name: string; sum: string }>`${sql.raw(parts.join('\nUNION ALL\n'))}`.execute(
    db,
  );
  return Object.fromEntries(rows.map((r) => [r.name, r.sum]));
}
