import { sql } from 'kysely';
import { describe, expect, it } from 'vitest';
import { hostBookingOfNode } from '../../db/allocations/bookings.ts';
import { useTestDatabase } from '../support/database.ts';

const t = useTestDatabase();

/** The plan of `query` with sequential scans ruled out, as one string. */
async function planOf(query: ReturnType<typeof sql>) {
  return t.db.transaction().execute(async (trx) => {
    await sql`SET LOCAL enable_seqscan = off`.execute(trx);
    const { rows } = await sql<{ 'QUERY PLAN': string }>`EXPLAIN ${query}`.execute(trx);
    return rows.map((r) => r['QUERY PLAN']).join('\n');
  });
}

describe("a node's host bookings", () => {
  it.each(['scalar_bookings', 'hold_bookings'])(
    'are looked up in %s through its node index, by node, resource and end',
    async (table) => {
      const plan = await planOf(sql`
        SELECT sum(amount) FROM ${sql.table(table)} s
        WHERE ${hostBookingOfNode('s', sql`${'node_x'}::text`, sql`compute_now()`)} AND s.resource = 'vcpu'
          AND s.during && tstzrange(compute_now(), compute_now() + interval '1 hour')`);
      expect(plan).toContain(`${table.replace('bookings', 'bookings_node_idx')}`);
      expect(plan).toMatch(/Index Cond: \(\(node_id = .*resource = .*COALESCE\(upper\(during\)/);
    },
  );

  it('are looked up by the guard triggers through the same index', async () => {
    const { rows } = await sql<{ name: string; body: string }>`
      SELECT proname AS name, prosrc AS body FROM pg_proc
      WHERE proname IN ('guard_scalar_bookings_inserted', 'guard_host_scalar_sum')`.execute(t.db);
    expect(rows).toHaveLength(2);
    for (const { body } of rows) {
      const lookups = body.match(/FROM (scalar|hold)_bookings/g) ?? [];
      const bounded = body.match(/coalesce\(upper\(during\), 'infinity'::timestamptz\) >= lower\(/g) ?? [];
      expect(lookups.length).toBeGreaterThan(0);
      expect(bounded.length).toBe(lookups.length);
    }
  });
});
