import { sql } from 'kysely';
import { beforeAll, describe, expect, it } from 'vitest';
import { createAdmissionCaches } from '../../core/admission-caches.ts';
import { checkBookingInvariants } from '../../db/allocations/invariants.ts';
import { placeDraftAtOnce, queueDraftAtOnce } from '../../db/reservations/place-draft-at-once.ts';
import { h100Pool, type TenantFixture, tenantWithMember } from './fixtures.ts';
import { useAdmissionHarness } from './harness.ts';

// Admission places a fresh draft in single statements (db/reservations/place-draft-at-once.ts):
// its quota guard and the draft's own guard must refuse the whole statement, never a part of it.
const h = useAdmissionHarness({ max: 20 });
let acme: TenantFixture;
let poolId: string;
let roomyPoolId: string;
let sparePoolId: string;

beforeAll(async () => {
  acme = await tenantWithMember(h, 'acme');
  // A node for each of the 16 requests below (so none loses a race for a node), quota for 6.
  poolId = (await h100Pool(h, { nodes: 16, tenants: ['acme'], gpuQuota: 6 })).poolId;
  roomyPoolId = (await h100Pool(h, { nodes: 8, tenants: ['acme'], gpuQuota: 64, name: 'roomy' })).poolId;
  sparePoolId = (await h100Pool(h, { nodes: 2, tenants: ['acme'], gpuQuota: 16, name: 'spare' })).poolId;
});

describe('placement in one statement', () => {
  it('charges quota exactly to its limit when 16 creates race for it: the rest are refused whole', async () => {
    const answers = await Promise.all(
      Array.from({ length: 16 }, (_, i) =>
        h.call(acme.token, 'reservations/create', {
          tenantId: 'acme',
          poolId,
          devices: [{ class: 'gpu', count: 1 }],
          duration: '1h',
          idempotencyKey: `race-${i}`,
        }),
      ),
    );
    const placed = answers.filter((a) => a.status === 200);
    expect(placed.map((a) => a.body.data.state)).toEqual(Array(6).fill('placed'));
    const refused = answers.filter((a) => a.status !== 200);
    expect(refused).toHaveLength(10);
    for (const a of refused) {
      expect(a).toMatchObject({ status: 429, body: { error: { code: 'QUOTA_EXCEEDED' } } });
    }

    const { rows: used } = await sql<{ used: string }>`
      SELECT used FROM quotas WHERE tenant_id = 'acme' AND pool_id = ${poolId} AND resource = 'gpu'`.execute(
      h.t.db,
    );
    expect(Number(used[0]!.used)).toBe(6);
    const { rows: counts } = await sql<{
      allocations: string;
      bookings: string;
      charges: string;
      events: string;
    }>`
      SELECT (SELECT count(*) FROM allocations) AS allocations,
             (SELECT count(*) FROM device_bookings) AS bookings,
             (SELECT count(*) FROM quota_charges WHERE refunded_at IS NULL) AS charges,
             (SELECT count(*) FROM outbox_events WHERE type = 'reservation.placed') AS events`.execute(
      h.t.db,
    );
    expect(counts[0]).toEqual({ allocations: '6', bookings: '6', charges: '6', events: '6' });
    const { rows: states } = await sql<{ state: string; n: string }>`
      SELECT state, count(*) AS n FROM reservations GROUP BY state ORDER BY state`.execute(h.t.db);
    // A refused draft stays a hidden draft, decided again when its key is retried.
    expect(states).toEqual([
      { state: 'draft', n: '10' },
      { state: 'placed', n: '6' },
    ]);
    expect(await checkBookingInvariants(h.t.db)).toEqual({ deviceOverlaps: 0, scalarOverbookings: 0 });
  });

  it('places a key retried while its first call is placing it once: the draft guard refuses the loser whole', async () => {
    const body = (i: number) => ({
      tenantId: 'acme',
      poolId: roomyPoolId,
      devices: [{ class: 'gpu', count: 2 }],
      duration: '1h',
      idempotencyKey: `twice-${i}`,
    });
    const answers = await Promise.all(
      Array.from({ length: 24 }, (_, i) => h.call(acme.token, 'reservations/create', body(i >> 1))),
    );
    expect(answers.filter((a) => a.status !== 200).map((a) => a.body.error)).toEqual([]);
    for (let i = 0; i < 24; i += 2) {
      expect(answers[i]!.body.data.id).toBe(answers[i + 1]!.body.data.id);
      expect(answers[i]!.body.data.state).toBe('placed');
    }
    const { rows } = await sql<{
      reservations: string;
      allocations: string;
      charged: string;
      events: string;
    }>`
      SELECT count(DISTINCT r.id) AS reservations,
             (SELECT count(*) FROM allocations a JOIN reservations x ON x.id = a.reservation_id
               WHERE x.pool_id = ${roomyPoolId}) AS allocations,
             (SELECT sum(amount) FROM quota_charges WHERE pool_id = ${roomyPoolId} AND refunded_at IS NULL) AS charged,
             (SELECT count(*) FROM outbox_events WHERE type = 'reservation.placed'
               AND data->>'poolId' = ${roomyPoolId}) AS events
      FROM reservations r WHERE r.pool_id = ${roomyPoolId}`.execute(h.t.db);
    expect(rows[0]).toEqual({ reservations: '12', allocations: '12', charged: '24', events: '12' });
    const { rows: used } = await sql<{ used: string }>`
      SELECT used FROM quotas WHERE tenant_id = 'acme' AND pool_id = ${roomyPoolId}`.execute(h.t.db);
    expect(Number(used[0]!.used)).toBe(24);
    expect(await checkBookingInvariants(h.t.db)).toEqual({ deviceOverlaps: 0, scalarOverbookings: 0 });
  });

  it('answers the reservation exactly as a read right after shows it (one with a lease and a project too)', async () => {
    for (const extra of [{}, { leaseSeconds: 600, projectId: 'proj-a' }]) {
      const created = await h.call(acme.token, 'reservations/create', {
        tenantId: 'acme',
        poolId: roomyPoolId,
        devices: [{ class: 'gpu', count: 3 }],
        duration: '2h',
        idempotencyKey: `view-${Object.keys(extra).length}`,
        ...extra,
      });
      expect(created.status).toBe(200);
      const read = await h.call(acme.token, 'reservations/get', {
        tenantId: 'acme',
        reservationId: created.body.data.id,
      });
      expect(created.body.data).toEqual(read.body.data);
      expect(created.body.data.allocations[0].deviceIds).toHaveLength(3);
    }
  });

  it('writes nothing for a draft that was decided meanwhile: the statement fails whole', async () => {
    const created = await h.call(acme.token, 'reservations/create', {
      tenantId: 'acme',
      poolId: sparePoolId,
      // A whole node, so the stale draft's plan picks another one (whose allocation no unique
      // constraint refuses): only the draft's own guard stands in the way.
      devices: [{ class: 'gpu', count: 8 }],
      duration: '1h',
      idempotencyKey: 'decided-meanwhile',
    });
    expect(created.body.data.state).toBe('placed');
    const counts = async () =>
      (
        await sql<{ allocations: string; used: string; events: string; audits: string }>`
          SELECT (SELECT count(*) FROM allocations) AS allocations,
                 (SELECT used FROM quotas WHERE tenant_id = 'acme' AND pool_id = ${sparePoolId}) AS used,
                 (SELECT count(*) FROM outbox_events) AS events,
                 (SELECT count(*) FROM audit_events) AS audits`.execute(h.t.db)
      ).rows[0];
    const before = await counts();
    const placed = await h.t.db
      .selectFrom('reservations')
      .selectAll()
      .where('id', '=', created.body.data.id)
      .executeTakeFirstOrThrow();
    // The draft as its creator saw it, before the placement that has since committed.
    const draft = { ...placed, state: 'draft' as const, version: placed.version - 1 };
    const audit = {
      actorIdentityId: acme.identityId,
      action: 'compute:reservations:create',
      requestId: 'r',
      context: {},
    };
    const outcome = await placeDraftAtOnce(h.t.db, {
      row: draft,
      now: Date.now(), // wall time: a window for the stale draft; the database refuses it anyway
      audit,
      caches: createAdmissionCaches(),
    });
    expect(outcome).toBeNull();
    expect(await counts()).toEqual(before);
    // The pool-lease placer's admission statement has the same guard.
    expect(await queueDraftAtOnce(h.t.db, { row: draft, now: 0, audit, onNotifyError: () => {} })).toBeNull();
    expect(await counts()).toEqual(before);
  });
});
