import { sql } from 'kysely';
import pg from 'pg';
import { beforeAll, describe, expect, it } from 'vitest';
import { createAdmissionCaches } from '../../core/admission-caches.ts';
import { checkBookingInvariants } from '../../db/allocations/invariants.ts';
import { placeDraftAtOnce } from '../../db/reservations/place-draft-at-once.ts';
import { h100Pool, type TenantFixture, tenantWithMember } from './fixtures.ts';
import { useAdmissionHarness } from './harness.ts';

// The cycle a key retried while its first call is placing it can close: the first call's
// statement (placeDraftAtOnce) holds the node's host rows and waits for the draft's row, which the
// second call's placeDraft holds while it waits for that node's rows. PostgreSQL rolls the one
// that waited first back; when that is the statement, the call must go on the transactional way,
// never answer the deadlock (it failed one run in five of tests/admission/at-once.test.ts).
const h = useAdmissionHarness({ max: 8 });
let acme: TenantFixture;
let poolId: string;

beforeAll(async () => {
  acme = await tenantWithMember(h, 'acme');
  poolId = (await h100Pool(h, { nodes: 1, tenants: ['acme'], gpuQuota: 1, name: 'single' })).poolId;
});

describe('placement in one statement, in a deadlock', () => {
  it('answers not decided, having written nothing, and the same key is then placed once', async () => {
    const body = {
      tenantId: 'acme',
      poolId,
      devices: [{ class: 'gpu', count: 2 }],
      duration: '1h',
      idempotencyKey: 'cycle',
    };
    // Refused for quota, the draft stays a draft: the row a retried key finds.
    const refused = await h.call(acme.token, 'reservations/create', body);
    expect(refused.body.error.code).toBe('QUOTA_EXCEEDED');
    await sql`UPDATE quotas SET limit_amount = 8 WHERE tenant_id = 'acme' AND pool_id = ${poolId}`.execute(
      h.t.db,
    );
    const draft = await h.t.db
      .selectFrom('reservations')
      .selectAll()
      .where('pool_id', '=', poolId)
      .where('state', '=', 'draft')
      .executeTakeFirstOrThrow();
    const { node_id: nodeId } = await h.t.db
      .selectFrom('nodes')
      .select('id as node_id')
      .where('pool_id', '=', poolId)
      .executeTakeFirstOrThrow();

    // The second call's transaction, as placeDraft holds it: the draft's row first.
    const other = new pg.Client({ connectionString: h.t.url });
    await other.connect();
    try {
      await other.query('BEGIN');
      // So that the statement, which waits first, is the one PostgreSQL rolls back.
      await other.query(`SET LOCAL deadlock_timeout = '30s'`);
      await other.query('SELECT 1 FROM reservations WHERE id = $1 FOR UPDATE', [draft.id]);

      const statement = placeDraftAtOnce(h.t.db, {
        row: draft,
        now: Date.now(), // wall time: the window starts now, as writeDraft's clock would say
        audit: {
          actorIdentityId: acme.identityId,
          action: 'compute:reservations:create',
          requestId: 'r',
          context: {},
        },
        caches: createAdmissionCaches(),
      });
      // The statement has the node's rows and waits for the draft's.
      await expect
        .poll(
          async () =>
            (
              await sql<{ n: number }>`
                SELECT count(*)::int AS n FROM pg_stat_activity
                WHERE wait_event_type = 'Lock' AND query LIKE '%host_resources%'
                  AND datname = current_database() AND pid <> pg_backend_pid()`.execute(h.t.db)
            ).rows[0]!.n,
          { timeout: 10_000, interval: 20 },
        )
        .toBe(1);
      // Then the other transaction asks for the node's rows: the cycle closes.
      const waitsForNode = other.query('SELECT 1 FROM host_resources WHERE node_id = $1 FOR UPDATE', [
        nodeId,
      ]);
      expect(await statement).toBeNull();
      await waitsForNode;
      await other.query('ROLLBACK');
    } finally {
      await other.end();
    }

    const { rows } = await sql<{ state: string; allocations: number; used: string }>`
      SELECT r.state, (SELECT count(*)::int FROM allocations a WHERE a.reservation_id = r.id) AS allocations,
             (SELECT used FROM quotas WHERE tenant_id = 'acme' AND pool_id = ${poolId}) AS used
      FROM reservations r WHERE r.id = ${draft.id}`.execute(h.t.db);
    expect(rows[0]).toEqual({ state: 'draft', allocations: 0, used: '0' });

    // Both calls of the key, at once: one reservation, placed once.
    const answers = await Promise.all([1, 2].map(() => h.call(acme.token, 'reservations/create', body)));
    expect(answers.map((a) => [a.status, a.body.data?.state])).toEqual([
      [200, 'placed'],
      [200, 'placed'],
    ]);
    expect(answers[0]!.body.data.id).toBe(draft.id);
    expect(answers[1]!.body.data.id).toBe(draft.id);
    expect(await checkBookingInvariants(h.t.db)).toEqual({ deviceOverlaps: 0, scalarOverbookings: 0 });
  });
});
