import { sql } from 'kysely';
import { beforeAll, describe, expect, it } from 'vitest';
import { h100Pool, type TenantFixture, tenantWithMember } from './fixtures.ts';
import { useAdmissionHarness } from './harness.ts';

// Concurrent creates in a pool-lease pool are queued together (db/reservations/queue-drafts.ts):
// one statement for all of them, all or nothing, and each answered as if it had come alone when
// that statement cannot take them all (a quota that runs out among them).
const h = useAdmissionHarness({ max: 20 });
let acme: TenantFixture;
let globex: TenantFixture;
let roomyPoolId: string;
let tightPoolId: string;

beforeAll(async () => {
  acme = await tenantWithMember(h, 'acme');
  globex = await tenantWithMember(h, 'globex');
  const policy = { placer: 'pool-lease' };
  roomyPoolId = (
    await h100Pool(h, { nodes: 2, tenants: ['acme', 'globex'], gpuQuota: 64, policy, name: 'roomy' })
  ).poolId;
  tightPoolId = (await h100Pool(h, { nodes: 2, tenants: ['acme'], gpuQuota: 6, policy, name: 'tight' }))
    .poolId;
});

const create = (who: TenantFixture, poolId: string, key: string) =>
  h.call(who.token, 'reservations/create', {
    tenantId: who.id,
    poolId,
    devices: [{ class: 'gpu', count: 1 }],
    duration: '1h',
    idempotencyKey: key,
  });

const queuedIn = async (poolId: string) => {
  const { rows } = await sql<{ tenant_id: string; updated_at: Date; version: number }>`
    SELECT tenant_id, updated_at, version FROM reservations
    WHERE pool_id = ${poolId} AND state = 'pending' AND conditions @> '[{"type":"Queued"}]'`.execute(h.t.db);
  return rows;
};

const ledger = async (poolId: string) => {
  const { rows } = await sql<{ used: string; charges: string; events: string; audits: string }>`
    SELECT (SELECT COALESCE(sum(used), 0) FROM quotas WHERE pool_id = ${poolId}) AS used,
           (SELECT count(*) FROM quota_charges WHERE pool_id = ${poolId} AND refunded_at IS NULL) AS charges,
           (SELECT count(*) FROM outbox_events WHERE type = 'reservation.queued' AND data->>'poolId' = ${poolId}) AS events,
           (SELECT count(*) FROM audit_events WHERE context->>'poolId' = ${poolId} AND context->>'outcome' = 'queued') AS audits`.execute(
    h.t.db,
  );
  const row = rows[0]!;
  return {
    used: Number(row.used),
    charges: Number(row.charges),
    events: Number(row.events),
    audits: Number(row.audits),
  };
};

describe('pool-lease creates queued together', () => {
  it('queues concurrent creates of two tenants in one statement, each with its charge, event and audit row', async () => {
    const answers = await Promise.all(
      Array.from({ length: 12 }, (_, i) => create(i % 2 ? acme : globex, roomyPoolId, `together-${i}`)),
    );
    expect(answers.map((a) => a.status)).toEqual(Array(12).fill(200));
    for (const a of answers) {
      expect(a.body.data).toMatchObject({
        state: 'pending',
        conditions: [{ type: 'Queued', reason: 'PoolPlacer' }],
        operation: { state: 'running' },
      });
    }
    const queued = await queuedIn(roomyPoolId);
    expect(queued).toHaveLength(12);
    // Queued by fewer statements than creates: a statement's rows share its clock reading.
    expect(new Set(queued.map((r) => r.updated_at.getTime())).size).toBeLessThan(12);
    expect(await ledger(roomyPoolId)).toEqual({ used: 12, charges: 12, events: 12, audits: 12 });
  });

  it('refuses whole, and answers one by one, when a quota runs out among the creates gathered', async () => {
    const answers = await Promise.all(
      Array.from({ length: 10 }, (_, i) => create(acme, tightPoolId, `tight-${i}`)),
    );
    const queued = answers.filter((a) => a.status === 200);
    expect(queued.map((a) => a.body.data.state)).toEqual(Array(6).fill('pending'));
    const refused = answers.filter((a) => a.status !== 200);
    expect(refused).toHaveLength(4);
    for (const a of refused) expect(a.body.error.code).toBe('QUOTA_EXCEEDED');
    expect(await queuedIn(tightPoolId)).toHaveLength(6);
    expect(await ledger(tightPoolId)).toEqual({ used: 6, charges: 6, events: 6, audits: 6 });
  });
});
