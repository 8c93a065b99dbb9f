import { sql } from 'kysely';
import pg from 'pg';
import { describe, expect, it } from 'vitest';
import { createGatewayFixture } from '../support/gateway.ts';

// A gateway's loops run transactions one after another (the liveness sweep: silent nodes, then
// overdue commands, then timed-out ones). stop() must wait for a run under way, or its next
// transaction begins after the caller has closed the database.
describe('gateway stop', () => {
  it('waits for a liveness sweep under way before it answers', async () => {
    const fixture = await createGatewayFixture({ leaseMs: 2_000 });
    const other = new pg.Client({ connectionString: fixture.database.url });
    await other.connect();
    try {
      // The sweep's command statements wait behind this lock.
      await other.query('BEGIN');
      await other.query('LOCK TABLE node_commands IN EXCLUSIVE MODE');
      await expect
        .poll(
          async () =>
            (
              await sql<{ n: number }>`
                SELECT count(*)::int AS n FROM pg_stat_activity
                WHERE datname = current_database() AND wait_event_type = 'Lock'
                  AND query LIKE '%node_commands%' AND pid <> pg_backend_pid()`.execute(fixture.database.db)
            ).rows[0]!.n,
          { timeout: 15_000, interval: 50 },
        )
        .toBeGreaterThan(0);

      let stopped = false;
      const stopping = fixture.gateway.stop().then(() => {
        stopped = true;
      });
      // A round trip of the database's own: ample time for a stop that does not wait to answer.
      await other.query('SELECT pg_sleep(0.2)');
      expect(stopped).toBe(false);
      await other.query('COMMIT');
      await stopping;
      expect(stopped).toBe(true);
      // Nothing of the gateway is left waiting on the database.
      const { rows } = await sql<{ n: number }>`
        SELECT count(*)::int AS n FROM pg_stat_activity
        WHERE datname = current_database() AND state = 'active' AND pid <> pg_backend_pid()`.execute(
        fixture.database.db,
      );
      expect(rows[0]!.n).toBe(0);
    } finally {
      await other.end();
      await fixture.close();
    }
  });
});
