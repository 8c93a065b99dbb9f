import { sql } from 'kysely';
import { beforeAll, describe, expect, it } from 'vitest';
import { readComputeNow } from '../../db/clock.ts';
import { type DraftInsert, insertDraftSoon } from '../../db/reservations/draft-insert.ts';
import { reservationDraftId } from '../../domain/ids.ts';
import { normalizeRequest } from '../../domain/reservation-request.ts';
import { h100Pool, type TenantFixture, tenantWithMember } from './fixtures.ts';
import { useAdmissionHarness } from './harness.ts';

// Concurrent creates share their draft's statement (db/reservations/draft-insert.ts): each must
// still get the answer it would get alone, whatever the drafts gathered with it do.
const h = useAdmissionHarness({ max: 20 });
let acme: TenantFixture;
let poolId: string;
let notOfferedPoolId: string;

beforeAll(async () => {
  acme = await tenantWithMember(h, 'acme');
  poolId = (await h100Pool(h, { nodes: 4, tenants: ['acme'], gpuQuota: 64 })).poolId;
  notOfferedPoolId = (await h100Pool(h, { nodes: 1, tenants: ['other'], gpuQuota: 8, name: 'other' })).poolId;
});

const create = (key: string, extra: Record<string, unknown> = {}) =>
  h.call(acme.token, 'reservations/create', {
    tenantId: 'acme',
    poolId,
    devices: [{ class: 'gpu', count: 1 }],
    duration: '1h',
    idempotencyKey: key,
    ...extra,
  });

const draft = (key: string, extra: Partial<DraftInsert> = {}): DraftInsert => {
  const request = normalizeRequest({
    tenantId: 'acme',
    poolId,
    devices: [{ class: 'gpu', count: 1 }],
    duration: '1h',
  });
  return {
    id: reservationDraftId('acme', acme.identityId, key),
    tenantId: 'acme',
    poolId,
    ownerIdentityId: acme.identityId,
    idempotencyKey: key,
    request,
    hash: `hash-${key}`,
    horizonMs: 90 * 86_400_000,
    share: { vcpu: 0, memoryGiB: 0, hugepages1Gi: 0 },
    attributes: {},
    ...extra,
  };
};

describe('drafts written together', () => {
  it('answers each of many concurrent creates as if it were alone', async () => {
    const now = (await readComputeNow(h.t.db)).getTime();
    const answers = await Promise.all([
      ...Array.from({ length: 8 }, (_, i) => create(`together-${i}`)),
      create('twice'),
      create('twice'),
      create('reused'),
      create('reused', { duration: '2h' }),
      create('not-offered', { poolId: notOfferedPoolId }),
      create('far-ahead', { start: now + 91 * 86_400_000 }),
    ]);
    const summary = answers.map((a) => a.body.data?.state ?? a.body.error?.code);
    expect(summary.slice(0, 8)).toEqual(Array(8).fill('placed'));
    // The same request twice: one reservation, both answered with it.
    expect(summary.slice(8, 10)).toEqual(['placed', 'placed']);
    expect(answers[8]!.body.data.id).toBe(answers[9]!.body.data.id);
    // One key, two requests: whichever came second is a conflict naming the first.
    expect([...summary.slice(10, 12)].sort()).toEqual(['CONFLICT', 'placed']);
    const conflict = answers.slice(10, 12).find((a) => a.status === 409)!;
    const kept = answers.slice(10, 12).find((a) => a.status === 200)!;
    expect(conflict.body.error.details.reservationId).toBe(kept.body.data.id);
    expect(summary.slice(12)).toEqual(['NOT_FOUND', 'INVALID_INPUT']);

    const { rows } = await sql<{ key: string; n: string }>`
      SELECT idempotency_key AS key, count(*) AS n FROM reservations
      WHERE tenant_id = 'acme' GROUP BY idempotency_key ORDER BY idempotency_key`.execute(h.t.db);
    expect(rows.map((r) => [r.key, Number(r.n)])).toEqual(
      [...Array.from({ length: 8 }, (_, i) => `together-${i}`), 'reused', 'twice']
        .sort()
        .map((key) => [key, 1]),
    );
  });

  it('inserts the drafts asked for in one turn of the event loop in one statement', async () => {
    const inserted = await Promise.all(
      ['one-turn-a', 'one-turn-b', 'one-turn-c'].map((key) => insertDraftSoon(h.t.db, draft(key))),
    );
    expect(inserted.map((i) => i.row?.state)).toEqual(['draft', 'draft', 'draft']);
    // One statement, one transaction: one clock reading, one creation time.
    expect(new Set(inserted.map((i) => i.checkedAt)).size).toBe(1);
    expect(new Set(inserted.map((i) => i.row!.created_at.getTime())).size).toBe(1);
    const { rows } = await sql<{ n: string }>`
      SELECT count(*) AS n FROM authz_projection
      WHERE resource_id = ANY(${inserted.map((i) => i.row!.id)}::text[])`.execute(h.t.db);
    expect(Number(rows[0]!.n)).toBe(3);
  });

  it('fails alone a draft the statement cannot take, and inserts the ones gathered with it', async () => {
    const oversized = draft('oversized');
    const settled = await Promise.allSettled([
      insertDraftSoon(h.t.db, draft('beside-a')),
      insertDraftSoon(h.t.db, { ...oversized, request: { ...oversized.request, leaseSeconds: 2 ** 40 } }),
      insertDraftSoon(h.t.db, draft('beside-b')),
    ]);
    expect(settled.map((s) => s.status)).toEqual(['fulfilled', 'rejected', 'fulfilled']);
    expect((settled[1] as PromiseRejectedResult).reason.message).toMatch(/out of range/);
    const { rows } = await sql<{ key: string }>`
      SELECT idempotency_key AS key FROM reservations
      WHERE idempotency_key IN ('beside-a', 'beside-b', 'oversized') ORDER BY 1`.execute(h.t.db);
    expect(rows.map((r) => r.key)).toEqual(['beside-a', 'beside-b']);
  });
});
