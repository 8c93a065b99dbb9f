import { sql } from 'kysely';
import { beforeAll, describe, expect, it } from 'vitest';
import { createDraftCleanupActivities } from '../../activities/draft-cleanup.ts';
import { advanceComputeClock } from '../../db/clock.ts';
import { offerPool } from '../../db/nodes/fleet.ts';
import { h100Pool, type TenantFixture, tenantWithMember } from '../admission/fixtures.ts';
import { useAdmissionHarness } from '../admission/harness.ts';
import { useFixture } from '../support/hooks.ts';
import { testLogger } from '../support/logger.ts';
import { startTestTemporal } from '../support/temporal.ts';

// Hardening (issue 17): what refused requests leave behind (drafts after QUOTA_EXCEEDED, denials,
// expired confirmations) is removed after its retention by the worker's sweeper Schedule, in
// bounded batches; within the retention a retry with the same key is still decided again.

const h = useAdmissionHarness();
const hour = 3_600_000;
// The real sweeper Schedule (every second) on a worker of this file's own; its orphan sweep looks
// at nothing (a grace of ten years), so the only thing it does here is the draft cleanup (24 h).
const temporal = useFixture(
  () =>
    startTestTemporal({
      name: 'retention',
      db: h.t.db,
      log: testLogger('test-retention', 'warn'),
      iam: h.iam,
      timers: {},
      sweeper: { everyMs: 1_000, graceMs: 10 * 365 * 24 * hour },
    }),
  (t) => t.stop(),
);
let acme: TenantFixture;
let poolId: string;

const ask = (key: string, extra: Record<string, unknown> = {}, token = acme.token) =>
  h.call(token, 'reservations/create', {
    tenantId: 'acme',
    poolId,
    devices: [{ class: 'gpu', count: 4 }],
    duration: '2h',
    idempotencyKey: key,
    ...extra,
  });

async function states(keys: string[]): Promise<Record<string, string>> {
  const { rows } = await sql<{ key: string; state: string }>`
    SELECT idempotency_key AS key, state FROM reservations WHERE idempotency_key = ANY(${keys}::text[])`.execute(
    h.t.db,
  );
  return Object.fromEntries(rows.map((r) => [r.key, r.state]));
}

beforeAll(async () => {
  acme = await tenantWithMember(h, 'acme');
  poolId = (await h100Pool(h, { nodes: 2, tenants: ['acme'], gpuQuota: 2 })).poolId;
});

describe('refused requests past their retention', () => {
  it('go in bounded batches, each one transaction, idempotently', async () => {
    for (let i = 0; i < 25; i++) {
      expect((await ask(`batch-${i}`)).body.error.code).toBe('QUOTA_EXCEEDED');
    }
    await advanceComputeClock(h.t.db, 2 * hour);
    // A retention of one hour (the Schedule keeps 24): only this call removes them.
    const { removeRefusedDrafts } = createDraftCleanupActivities({ db: h.t.db, log: testLogger() });
    const batches = [];
    for (let i = 0; i < 4; i++)
      batches.push((await removeRefusedDrafts({ retentionMs: hour, limit: 10 })).removed);
    expect(batches).toEqual([10, 10, 5, 0]);
    expect(await states(Array.from({ length: 25 }, (_, i) => `batch-${i}`))).toEqual({});
  });

  it('are removed by the sweeper Schedule; newer ones, retried ones and live reservations stay', async () => {
    expect(temporal.worker).not.toBeNull();
    const live = (await ask('live', { devices: [{ class: 'gpu', count: 1 }] })).body.data;
    expect(live.state).toBe('placed');
    const ended = (await ask('ended', { devices: [{ class: 'gpu', count: 1 }] })).body.data;
    await h.call(acme.token, 'reservations/release', { tenantId: 'acme', reservationId: ended.id });

    // Refused now: over quota twice, denied by policy, and a confirmation left to expire.
    expect((await ask('quota-old')).body.error.code).toBe('QUOTA_EXCEEDED');
    expect((await ask('quota-retried')).body.error.code).toBe('QUOTA_EXCEEDED');
    await h.iam.admin.applyPolicy({
      tenantId: 'acme',
      name: 'no-long',
      document: {
        statements: [
          {
            effect: 'deny',
            actions: ['compute:reservations:create'],
            condition: { attribute: 'durationHours', operator: 'greaterThan', value: 100 },
          },
        ],
      },
    });
    const denied = await ask('denied-old', { devices: [{ class: 'gpu', count: 1 }], duration: '5d' });
    expect(denied.body.error.code).toBe('ACCESS_DENIED');
    const person = await h.iam.admin.createIdentity({ tenantId: 'acme', kind: 'person', name: 'lena' });
    await h.iam.admin.bindRole({ identityId: person.id, role: 'member' });
    const agent = await h.iam.admin.createIdentity({
      tenantId: 'acme',
      kind: 'agent',
      name: 'lenas-agent',
      personIdentityId: person.id,
      confirmActions: ['compute:reservations:create'],
    });
    await h.iam.admin.bindRole({ identityId: agent.id, role: 'member' });
    const agentToken = (await h.iam.admin.createToken({ identityId: agent.id })).token;
    const one = { devices: [{ class: 'gpu', count: 1 }] };
    expect((await ask('expired-old', one, agentToken)).body.error.code).toBe('CONFIRMATION_REQUIRED');
    await advanceComputeClock(h.t.db, 31 * 60_000);
    expect((await ask('expired-old', one, agentToken)).body.error.code).toBe('INVALID_STATE');
    const refused = ['quota-old', 'quota-retried', 'denied-old', 'expired-old'];
    expect(await states(refused)).toEqual({
      'quota-old': 'draft',
      'quota-retried': 'draft',
      'denied-old': 'denied',
      'expired-old': 'expired',
    });

    // Within the retention a retry is decided again (and a denial answered again).
    await advanceComputeClock(h.t.db, 23 * hour);
    expect((await ask('quota-retried')).body.error.code).toBe('QUOTA_EXCEEDED');
    const again = await ask('denied-old', { devices: [{ class: 'gpu', count: 1 }], duration: '5d' });
    expect(again.body.error.code).toBe('ACCESS_DENIED');
    expect(await states(refused)).toEqual({
      'quota-old': 'draft',
      'quota-retried': 'draft',
      'denied-old': 'denied',
      'expired-old': 'expired',
    });

    // Read before the clock passes the retention: the sweeper may remove them at any moment after.
    const removedIds = await sql<{ id: string }>`
      SELECT id FROM reservations WHERE idempotency_key IN ('quota-old', 'denied-old', 'expired-old')`.execute(
      h.t.db,
    );
    expect(removedIds.rows).toHaveLength(3);
    // Past it: the first refusals are over 24 hours old, the retried draft 2 hours, a new one fresh.
    await advanceComputeClock(h.t.db, 2 * hour);
    expect((await ask('quota-new')).body.error.code).toBe('QUOTA_EXCEEDED');
    await expect
      .poll(() => states([...refused, 'quota-new', 'live', 'ended']), { timeout: 30_000, interval: 250 })
      .toEqual({ 'quota-retried': 'draft', 'quota-new': 'draft', live: 'placed', ended: 'released' });
    const ids = removedIds.rows.map((r) => r.id);
    const { rows: authz } = await sql`
      SELECT 1 FROM authz_projection WHERE resource_id = ANY(${ids}::text[])`.execute(h.t.db);
    expect(authz).toHaveLength(0);
    const { rows: kept } = await sql`
      SELECT 1 FROM authz_projection WHERE resource_id = ANY(${[live.id, ended.id]}::text[])`.execute(h.t.db);
    expect(kept).toHaveLength(2);
    const { rows: history } = await sql`
      SELECT 1 FROM outbox_events WHERE subject = ANY(${ids.map((id) => `reservation/${id}`)}::text[])`.execute(
      h.t.db,
    );
    expect(history.length).toBeGreaterThan(0);

    // A removed key starts afresh: decided again, from a new draft under the same id.
    await offerPool(h.t.db, { poolId, tenantId: 'acme', quota: { gpu: 64 } });
    const fresh = await ask('quota-old');
    expect(fresh.body.data).toMatchObject({ state: 'placed' });
    expect(ids).toContain(fresh.body.data.id);
    for (const r of [live.id, fresh.body.data.id])
      await h.call(acme.token, 'reservations/release', { tenantId: 'acme', reservationId: r });
  });
});
