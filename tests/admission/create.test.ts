import { sql } from 'kysely';
import { beforeAll, beforeEach, describe, expect, it } from 'vitest';
import { advanceComputeClock, readComputeNow } from '../../db/clock.ts';
import { offerPool } from '../../db/nodes/fleet.ts';
import { eventually } from '../support/eventually.ts';
import { joinSimulatedFleet, startTestGateway } from '../support/gateway.ts';
import { boundedH100Policy } from '../support/iam.ts';
import { useTempDir } from '../support/temp-dir.ts';
import { h100Pool, type TenantFixture, tenantWithMember } from './fixtures.ts';
import { useAdmissionHarness } from './harness.ts';

const h = useAdmissionHarness();
const simDir = useTempDir('bc-admission-k8s-');
let acme: TenantFixture;
let acme2: TenantFixture;
let globex: TenantFixture;
let poolId: string;
let nodeIds: string[];

const base = (key: string, extra: Record<string, unknown> = {}) => ({
  tenantId: 'acme',
  poolId,
  devices: [{ class: 'gpu', count: 2 }],
  duration: '2h',
  idempotencyKey: key,
  ...extra,
});

const creates = () => h.decisions.filter((d) => d.action === 'compute:reservations:create').length;

beforeAll(async () => {
  acme = await tenantWithMember(h, 'acme');
  acme2 = await tenantWithMember(h, 'acme', { name: 'acme-second' });
  globex = await tenantWithMember(h, 'globex');
  const pool = await h100Pool(h, { nodes: 3, tenants: ['acme'], gpuQuota: 64 });
  poolId = pool.poolId;
  nodeIds = pool.nodes.map((n) => n.id);
});

beforeEach(async () => {
  // Every test starts from an empty fleet and a fresh quota.
  const { rows } = await sql<{
    id: string;
  }>`SELECT id FROM reservations WHERE state NOT IN ('released', 'cancelled', 'denied', 'expired', 'failed', 'draft')`.execute(
    h.t.db,
  );
  for (const r of rows)
    await h.call(acme.token, 'reservations/release', { tenantId: 'acme', reservationId: r.id });
  await offerPool(h.t.db, { poolId, tenantId: 'acme', quota: { gpu: 64 } });
});

describe('reservations.create', () => {
  it('places whole GPUs in one NVLink domain and records draft, decision, quota, outbox, audit and authz row', async () => {
    const before = creates();
    const res = await h.call(
      acme.token,
      'reservations/create',
      base('place-1', { devices: [{ class: 'gpu', count: 4, topology: 'nvlink-all' }], duration: '8h' }),
    );
    expect(res.status).toBe(200);
    const r = res.body.data;
    expect(r).toMatchObject({
      tenantId: 'acme',
      poolId,
      state: 'placed',
      ownerIdentityId: acme.identityId,
      idempotencyKey: 'place-1',
      operation: { state: 'succeeded' },
      request: {
        duration: '28800000ms',
        binding: 'hold',
        devices: [{ class: 'gpu', count: 4, topology: 'nvlink-all' }],
      },
    });
    expect(r.id).toMatch(/^rsv_[a-z2-7]{52}$/);
    expect(r.during.end - r.during.start).toBe(8 * 3_600_000);
    expect(r.allocations).toHaveLength(1);
    expect(r.allocations[0].deviceIds).toHaveLength(4);
    expect(creates() - before).toBe(1);
    expect(h.lifecycle.started).toContainEqual({ id: r.id, state: 'placed' });

    const { rows: events } = await sql<{
      type: string;
      data: any;
    }>`SELECT type, data FROM outbox_events WHERE subject = ${`reservation/${r.id}`}`.execute(h.t.db);
    expect(events.map((e) => e.type)).toEqual(['reservation.placed']);
    expect(events[0]!.data).toMatchObject({ state: 'placed', poolId, nodeIds: [r.allocations[0].nodeId] });
    const { rows: audit } = await sql<{
      action: string;
      context: any;
    }>`SELECT action, context FROM audit_events WHERE resource_id = ${r.id}`.execute(h.t.db);
    expect(audit[0]).toMatchObject({
      action: 'compute:reservations:create',
      context: { identityId: acme.identityId, sessionKind: 'direct', requestId: expect.any(String) },
    });
    const { rows: authz } = await sql<{
      attributes: any;
      parent_id: string;
      owner_identity_id: string;
    }>`SELECT attributes, parent_id, owner_identity_id FROM authz_projection WHERE resource_id = ${r.id}`.execute(
      h.t.db,
    );
    expect(authz[0]).toMatchObject({
      parent_id: poolId,
      owner_identity_id: acme.identityId,
      attributes: {
        gpuModel: 'h100',
        gpuCount: 4,
        gpuSlices: 0,
        gangSize: 1,
        durationHours: 8,
        region: 'eu-central-1',
        binding: 'hold',
        spot: false,
        renewable: false,
        projectId: null,
        vcpu: 96,
        memoryGiB: 1024,
      },
    });
    const { rows: quota } = await sql<{
      used: string;
    }>`SELECT used FROM quotas WHERE tenant_id = 'acme' AND pool_id = ${poolId} AND resource = 'gpu'`.execute(
      h.t.db,
    );
    expect(Number(quota[0]!.used)).toBe(4);
  });

  it('answers a repeated key with the stored reservation and no second decision; 2h and 7200000 are one request', async () => {
    const first = await h.call(acme.token, 'reservations/create', base('same-1'));
    const before = creates();
    const again = await h.call(
      acme.token,
      'reservations/create',
      base('same-1', { duration: 7_200_000, binding: 'hold', wait: { timeoutMs: 1000 } }),
    );
    expect(again.status).toBe(200);
    expect(again.body.data.id).toBe(first.body.data.id);
    expect(again.body.data.version).toBe(first.body.data.version);
    expect(creates()).toBe(before);
    const { rows } = await sql<{
      n: string;
    }>`SELECT count(*) AS n FROM allocations WHERE reservation_id = ${first.body.data.id}`.execute(h.t.db);
    expect(Number(rows[0]!.n)).toBe(1);
  });

  it('refuses a different request under the same key with CONFLICT and details.reservationId', async () => {
    const first = await h.call(acme.token, 'reservations/create', base('conflict-1'));
    const other = await h.call(acme.token, 'reservations/create', base('conflict-1', { duration: '3h' }));
    expect(other).toMatchObject({
      status: 409,
      body: { error: { code: 'CONFLICT', details: { reservationId: first.body.data.id } } },
    });
    expect(other.body.error.message).toContain('idempotencyKey');
  });

  it('gives the same key from another identity a row of its own', async () => {
    const mine = await h.call(acme.token, 'reservations/create', base('shared-key'));
    const theirs = await h.call(acme2.token, 'reservations/create', base('shared-key', { duration: '3h' }));
    expect(theirs.status).toBe(200);
    expect(theirs.body.data.id).not.toBe(mine.body.data.id);
  });

  it('answers ACCESS_DENIED before reading anything for a foreign tenant, whether or not the pool exists', async () => {
    const before = creates();
    for (const pool of [poolId, 'pool_does_not_exist']) {
      const res = await h.call(globex.token, 'reservations/create', base('foreign', { poolId: pool }));
      expect(res).toMatchObject({ status: 403, body: { error: { code: 'ACCESS_DENIED' } } });
      expect(res.body.error.message).toContain('tenantId');
    }
    expect(creates()).toBe(before);
    const { rows } = await sql<{
      n: string;
    }>`SELECT count(*) AS n FROM reservations WHERE owner_identity_id = ${globex.identityId}`.execute(h.t.db);
    expect(Number(rows[0]!.n)).toBe(0);
  });

  it('answers NOT_FOUND for a pool not offered to the tenant', async () => {
    const res = await h.call(acme.token, 'reservations/create', base('nopool', { poolId: 'pool_nope' }));
    expect(res).toMatchObject({ status: 404, body: { error: { code: 'NOT_FOUND' } } });
    expect(res.body.error.message).toContain('poolId');
  });

  it('refuses bad input with INVALID_INPUT or UNSUPPORTED naming the field, and changes nothing', async () => {
    const cases: Array<[Record<string, unknown>, string, string]> = [
      [{ colour: 'red' }, 'INVALID_INPUT', 'colour'],
      [{ devices: [{ class: 'gpu', count: 0 }] }, 'INVALID_INPUT', 'devices[0].count'],
      [{ devices: [{ class: 'gpu', count: 2, extra: 1 }] }, 'INVALID_INPUT', 'devices[0].extra'],
      [{ duration: 'forever' }, 'INVALID_INPUT', 'duration'],
      [{ duration: '30s' }, 'INVALID_INPUT', 'duration'],
      [{ duration: '91d' }, 'INVALID_INPUT', 'duration'],
      [{ leaseSeconds: 10 }, 'INVALID_INPUT', 'leaseSeconds'],
      [{ idempotencyKey: '' }, 'INVALID_INPUT', 'idempotencyKey'],
      [{ binding: 'instance' }, 'UNSUPPORTED', 'binding'],
      [{ gang: { size: 1 } }, 'INVALID_INPUT', 'gang.size'],
      [{ gang: { size: 2, topologyKey: '' } }, 'INVALID_INPUT', 'gang.topologyKey'],
      [{ devices: [{ class: 'gpu.mig', count: 1 }] }, 'INVALID_INPUT', 'devices[0].class'],
      [{ binding: 'kubernetes' }, 'INVALID_INPUT', 'binding'],
      [{ binding: 'node' }, 'INVALID_INPUT', 'binding'],
    ];
    for (const [extra, code, field] of cases) {
      const res = await h.call(acme.token, 'reservations/create', base(`bad-${field}`, extra));
      expect({ extra, code: res.body.error?.code }).toEqual({ extra, code });
      expect(res.body.error.message).toContain(field);
    }
    const { rows } = await sql<{
      n: string;
    }>`SELECT count(*) AS n FROM reservations WHERE idempotency_key LIKE 'bad-%'`.execute(h.t.db);
    expect(Number(rows[0]!.n)).toBe(0);
  });

  it('keeps a QUOTA_EXCEEDED draft hidden and decides it again once quota allows', async () => {
    await offerPool(h.t.db, { poolId, tenantId: 'acme', quota: { gpu: 1 } });
    const refused = await h.call(acme.token, 'reservations/create', base('quota-1'));
    expect(refused).toMatchObject({
      status: 429,
      body: { error: { code: 'QUOTA_EXCEEDED', details: { resource: 'gpu', limit: 1, requested: 2 } } },
    });
    const { rows } = await sql<{
      id: string;
      state: string;
    }>`SELECT id, state FROM reservations WHERE idempotency_key = 'quota-1'`.execute(h.t.db);
    expect(rows).toEqual([{ id: expect.any(String), state: 'draft' }]);
    const id = rows[0]!.id;
    expect(
      (await h.call(acme.token, 'reservations/get', { tenantId: 'acme', reservationId: id })).body.error.code,
    ).toBe('NOT_FOUND');
    const listed = await h.call(acme.token, 'reservations/list', {
      tenantId: 'acme',
      scope: 'all',
      limit: 200,
    });
    expect(listed.body.data.reservations.map((r: { id: string }) => r.id)).not.toContain(id);

    await offerPool(h.t.db, { poolId, tenantId: 'acme', quota: { gpu: 64 } });
    const before = creates();
    const retried = await h.call(acme.token, 'reservations/create', base('quota-1'));
    expect(retried.body.data).toMatchObject({ id, state: 'placed' });
    expect(creates() - before).toBe(1);
  });

  it('keeps a refused key ACCESS_DENIED even after the policy changes', async () => {
    const policy = await h.iam.admin.applyPolicy({
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
    const refused = await h.call(acme.token, 'reservations/create', base('long-1', { duration: '5d' }));
    expect(refused).toMatchObject({ status: 403, body: { error: { code: 'ACCESS_DENIED' } } });
    expect(refused.body.error.message).toContain('no-long');
    await h.iam.admin.applyPolicy({
      tenantId: 'acme',
      name: 'no-long',
      document: { statements: [{ effect: 'deny', actions: ['compute:nothing:x'] }] },
    });
    const again = await h.call(acme.token, 'reservations/create', base('long-1', { duration: '5d' }));
    expect(again.body.error.code).toBe('ACCESS_DENIED');
    const { rows } = await sql<{
      id: string;
      state: string;
    }>`SELECT id, state FROM reservations WHERE idempotency_key = 'long-1'`.execute(h.t.db);
    expect(rows[0]!.state).toBe('denied');
    expect(policy.version).toBe(1);
    // Its terminal event, in the denial's transaction, once (the repeated refusal writes nothing).
    const { rows: events } = await sql<{
      type: string;
      data: Record<string, unknown>;
    }>`SELECT type, data FROM outbox_events WHERE subject = ${`reservation/${rows[0]!.id}`}`.execute(h.t.db);
    expect(events).toEqual([
      {
        type: 'reservation.denied',
        data: expect.objectContaining({ state: 'denied', reason: refused.body.error.message }),
      },
    ]);
  });

  it('enforces "at most 8 H100s for at most 72 hours in these regions" as one policy', async () => {
    await h.iam.admin.applyPolicy({
      tenantId: 'acme',
      name: 'bounded-h100',
      document: boundedH100Policy,
    });
    const ok = await h.call(
      acme.token,
      'reservations/create',
      base('bounded-ok', { devices: [{ class: 'gpu', count: 8 }], duration: '72h' }),
    );
    expect(ok.body.data.state).toBe('placed');
    const long = await h.call(acme.token, 'reservations/create', base('bounded-long', { duration: '73h' }));
    expect(long.body.error.code).toBe('ACCESS_DENIED');
    const extend = await h.call(acme.token, 'reservations/extend', {
      tenantId: 'acme',
      reservationId: ok.body.data.id,
      by: '1h',
      idempotencyKey: 'x',
    });
    expect(extend.body.error.code).toBe('ACCESS_DENIED');
    const { rows } = await sql<{
      pending: unknown;
    }>`SELECT pending FROM authz_projection WHERE resource_id = ${ok.body.data.id}`.execute(h.t.db);
    expect(rows[0]!.pending).toBeNull();
    await h.iam.admin.applyPolicy({
      tenantId: 'acme',
      name: 'bounded-h100',
      document: { statements: [{ effect: 'deny', actions: ['compute:nothing:x'] }] },
    });
  });

  it('leaves what fits nowhere pending with an Unschedulable/NoFit summary and a counter-offer', async () => {
    const first = await h.call(
      acme.token,
      'reservations/create',
      base('fill-1', { devices: [{ class: 'gpu', count: 8 }], duration: '4h' }),
    );
    const second = await h.call(
      acme.token,
      'reservations/create',
      base('fill-2', { devices: [{ class: 'gpu', count: 6 }], duration: '6h' }),
    );
    expect([first.body.data.state, second.body.data.state]).toEqual(['placed', 'placed']);
    const used = [first.body.data.allocations[0].nodeId, second.body.data.allocations[0].nodeId];
    const empty = nodeIds.find((id) => !used.includes(id))!;
    await sql`UPDATE nodes SET cordoned = true WHERE id = ${empty}`.execute(h.t.db);
    try {
      const res = await h.call(
        acme.token,
        'reservations/create',
        base('nofit-1', { devices: [{ class: 'gpu', count: 4, topology: 'nvlink-all' }], duration: '1h' }),
      );
      const r = res.body.data;
      expect(r.state).toBe('pending');
      expect(r.operation.state).toBe('pending');
      expect(r.conditions[0]).toMatchObject({ type: 'Unschedulable', reason: 'NoFit' });
      expect(r.conditions[0].message).toContain(
        '0 of 3 nodes fit: 2 lack 4 free GPUs in one NVLink domain, 1 is cordoned',
      );
      // The earliest start: when the 8-GPU reservation's 4 hours end.
      expect(r.conditions[0].earliestStart).toBe(first.body.data.during.end);
      expect(r.conditions[0].message).toContain(new Date(first.body.data.during.end).toISOString());
      const { rows } = await sql<{
        type: string;
      }>`SELECT type FROM outbox_events WHERE subject = ${`reservation/${r.id}`}`.execute(h.t.db);
      expect(rows.map((e) => e.type)).toEqual(['reservation.pending']);
      // A pending reservation keeps its quota charge.
      const { rows: charges } = await sql<{
        amount: string;
      }>`SELECT amount FROM quota_charges WHERE reservation_id = ${r.id}`.execute(h.t.db);
      expect(charges.map((c) => Number(c.amount))).toEqual([4]);
    } finally {
      await sql`UPDATE nodes SET cordoned = false WHERE id = ${empty}`.execute(h.t.db);
    }
  });

  it('books a future window for a calendar start', async () => {
    const { rows } = await sql<{ now: Date }>`SELECT compute_now() AS now`.execute(h.t.db);
    const start = rows[0]!.now.getTime() + 86_400_000;
    const res = await h.call(acme.token, 'reservations/create', base('calendar-1', { start }));
    expect(res.body.data).toMatchObject({ state: 'placed', during: { start, end: start + 2 * 3_600_000 } });
  });

  it("bounds a calendar start: at most the pool's horizon (default 90 days) ahead, at most 5 minutes past, by the clock", async () => {
    const now = (await readComputeNow(h.t.db)).getTime();
    const day = 86_400_000;
    const refusals: Array<[string, unknown, RegExp]> = [
      [
        'start-far',
        now + 91 * day,
        /^start: .* is too far ahead; in this pool a reservation may start at most 90 days from now .*pool policy calendar\.horizonDays/,
      ],
      [
        'start-past',
        now - 10 * 60_000,
        /^start: .* is in the past; a start may lie at most 5 minutes before now/,
      ],
      ['start-absurd', 1e300, /^start: /],
      ['start-year-10000', 253_402_300_800_000, /^start: /],
    ];
    for (const [key, start, message] of refusals) {
      const res = await h.call(acme.token, 'reservations/create', base(key, { start }));
      expect({ key, status: res.status, code: res.body.error?.code }).toEqual({
        key,
        status: 400,
        code: 'INVALID_INPUT',
      });
      expect(res.body.error.message).toMatch(message);
    }
    const preview = await h.call(acme.token, 'capacity/preview', {
      tenantId: 'acme',
      poolId,
      devices: [{ class: 'gpu', count: 2 }],
      duration: '2h',
      start: now + 91 * day,
    });
    expect(preview.body.error).toMatchObject({
      code: 'INVALID_INPUT',
      details: { field: 'start', horizonDays: 90 },
    });
    const { rows } = await sql<{ n: string }>`
      SELECT count(*) AS n FROM reservations WHERE idempotency_key LIKE 'start-%'`.execute(h.t.db);
    expect(Number(rows[0]!.n)).toBe(0);

    // Within the bounds: a start a minute ago starts now; one 89 days ahead books that window.
    const late = await h.call(acme.token, 'reservations/create', base('start-late', { start: now - 60_000 }));
    expect(late.body.data.state).toBe('placed');
    expect(late.body.data.during.start).toBeGreaterThanOrEqual(now);
    const ahead = now + 89 * day;
    const far = await h.call(acme.token, 'reservations/create', base('start-ahead', { start: ahead }));
    expect(far.body.data).toMatchObject({ state: 'placed', during: { start: ahead } });
    // A retry of an admitted key answers it, however the clock moved since.
    await advanceComputeClock(h.t.db, 60 * 60_000);
    try {
      const retried = await h.call(
        acme.token,
        'reservations/create',
        base('start-late', { start: now - 60_000 }),
      );
      expect(retried.body.data.id).toBe(late.body.data.id);
    } finally {
      await advanceComputeClock(h.t.db, -60 * 60_000);
    }
  });

  it('refuses a spent budget with SPEND_LIMIT_REACHED and keeps the draft', async () => {
    const metered = await h100Pool(h, {
      nodes: 1,
      tenants: ['acme'],
      gpuQuota: 8,
      name: 'metered',
      policy: { admission: { budgetCheck: 'meter' } },
    });
    await h.iam.admin.setBudget({ tenantId: 'acme', limit: 0 });
    const res = await h.call(acme.token, 'reservations/create', base('budget-1', { poolId: metered.poolId }));
    expect(res).toMatchObject({ status: 402, body: { error: { code: 'SPEND_LIMIT_REACHED' } } });
    await h.iam.admin.setBudget({ tenantId: 'acme', limit: 1000 });
    const retried = await h.call(
      acme.token,
      'reservations/create',
      base('budget-1', { poolId: metered.poolId }),
    );
    expect(retried.body.data.state).toBe('placed');
  });

  it('holds a delegated agent for its person and places on a retry with the same key after approval', async () => {
    const person = await h.iam.admin.createIdentity({ tenantId: 'acme', kind: 'person', name: 'dora' });
    await h.iam.admin.bindRole({ identityId: person.id, role: 'member' });
    const personToken = (await h.iam.admin.createToken({ identityId: person.id })).token;
    const agent = await h.iam.admin.createIdentity({
      tenantId: 'acme',
      kind: 'agent',
      name: 'doras-agent',
      personIdentityId: person.id,
      confirmActions: ['compute:reservations:create'],
    });
    await h.iam.admin.bindRole({ identityId: agent.id, role: 'member' });
    const agentToken = (await h.iam.admin.createToken({ identityId: agent.id })).token;

    const held = await h.call(agentToken, 'reservations/create', base('agent-1'));
    expect(held).toMatchObject({ status: 403, body: { error: { code: 'CONFIRMATION_REQUIRED' } } });
    const { confirmationId, reservationId, expiresAt } = held.body.error.details;
    expect(expiresAt).toEqual(expect.any(Number));
    const waiting = await h.call(agentToken, 'reservations/get', { tenantId: 'acme', reservationId });
    expect(waiting.body.data).toMatchObject({
      state: 'awaiting-confirmation',
      operation: { state: 'pending' },
    });
    expect(waiting.body.data.conditions[0]).toMatchObject({
      type: 'ConfirmationRequired',
      reason: confirmationId,
    });
    const { rows: charged } = await sql<{
      n: string;
    }>`SELECT count(*) AS n FROM quota_charges WHERE reservation_id = ${reservationId}`.execute(h.t.db);
    expect(Number(charged[0]!.n)).toBe(0);

    const listed = await h.call(personToken, 'confirmations/list', {});
    expect(listed.body.data.confirmations[0]).toMatchObject({ id: confirmationId, state: 'pending' });
    const approved = await h.call(personToken, 'confirmations/approve', { confirmationId });
    expect(approved.body.data.state).toBe('approved');
    expect(h.lifecycle.signals).toContainEqual({
      reservationId,
      signal: { type: 'confirmation', decision: 'approved' },
    });
    const placed = await h.call(agentToken, 'reservations/create', base('agent-1'));
    expect(placed.body.data).toMatchObject({ id: reservationId, state: 'placed' });
    const { rows: audit } = await sql<{
      context: any;
    }>`SELECT context FROM audit_events WHERE resource_id = ${reservationId} AND outcome = 'allowed'`.execute(
      h.t.db,
    );
    expect(audit[0]!.context).toMatchObject({
      sessionKind: 'delegated',
      agentIdentityId: agent.id,
      delegation: { personIdentityId: person.id },
    });

    // Past the deadline, a late retry expires the reservation.
    const late = await h.call(agentToken, 'reservations/create', base('agent-2'));
    expect(late.body.error.code).toBe('CONFIRMATION_REQUIRED');
    await advanceComputeClock(h.t.db, 31 * 60_000);
    try {
      const expired = await h.call(agentToken, 'reservations/create', base('agent-2'));
      expect(expired.body.error.code).toBe('INVALID_STATE');
      const view = await h.call(agentToken, 'reservations/get', {
        tenantId: 'acme',
        reservationId: late.body.error.details.reservationId,
      });
      expect(view.body.data).toMatchObject({
        state: 'expired',
        operation: { state: 'failed', error: { code: 'INVALID_STATE' } },
      });
    } finally {
      await advanceComputeClock(h.t.db, -31 * 60_000);
    }
  });

  it('lets the root tenant act for a tenant, and books kubernetes only on an owned pool whose nodes advertise it', async () => {
    const root = await h.call(h.rootToken, 'reservations/create', base('root-1'));
    expect(root.body.data).toMatchObject({ state: 'placed', tenantId: 'acme' });
    await h.call(h.rootToken, 'reservations/release', { tenantId: 'acme', reservationId: root.body.data.id });

    const owned = await h100Pool(h, {
      nodes: 2,
      tenants: ['acme'],
      gpuQuota: 16,
      name: 'k8s',
      policy: { kubernetes: true },
    });
    await sql`UPDATE pools SET owner_tenant_id = 'acme' WHERE id = ${owned.poolId}`.execute(h.t.db);
    const k8s = { poolId: owned.poolId, binding: 'kubernetes' };
    const waiting = await h.call(acme.token, 'reservations/create', base('k8s-1', k8s));
    expect(waiting.body.data.state).toBe('pending');
    expect(waiting.body.data.conditions[0].message).toContain('2 lack label bc.dev/cap.binding.kubernetes=*');
    await sql`INSERT INTO node_labels (node_id, key, value, source) VALUES (${owned.nodes[0]!.id}, 'bc.dev/cap.binding.kubernetes', 'true', 'operator')`.execute(
      h.t.db,
    );
    const operatorLabel = await h.call(acme.token, 'reservations/create', base('k8s-2', k8s));
    expect(operatorLabel.body.data.state).toBe('pending');
    // A bcd configured with the kubelet's device-plugin directory says binding.kubernetes in its
    // Hello, and the gateway makes it the system label: now the request places, on that node.
    const gateway = await startTestGateway({ db: h.t.db, lifecycle: h.lifecycle });
    const fleet = await joinSimulatedFleet(gateway, h.t.db, owned.poolId, {
      nodes: 1,
      rootDir: simDir,
      namePrefix: 'k8s-sim',
      shape: { gpus: 2, nvlinkDomainSize: 2 },
      kubelet: 'stand-in',
    });
    try {
      const simNode = fleet.nodes[0]!.nodeId;
      await eventually(async () => {
        const label = await h.t.db
          .selectFrom('node_labels as l')
          .innerJoin('nodes as n', 'n.id', 'l.node_id')
          .where('l.node_id', '=', simNode)
          .where('l.key', '=', 'bc.dev/cap.binding.kubernetes')
          .where('l.source', '=', 'system')
          .where('n.provision_state', '=', 'ready')
          .where((eb) => eb.exists(eb.selectFrom('devices as d').whereRef('d.node_id', '=', 'n.id')))
          .select('l.value')
          .executeTakeFirst();
        return label?.value === 'true';
      });
      const placed = await h.call(acme.token, 'reservations/create', base('k8s-3', k8s));
      expect(placed.body.data).toMatchObject({ state: 'placed', allocations: [{ nodeId: simNode }] });
      for (const r of [waiting, operatorLabel, placed]) {
        await h.call(acme.token, 'reservations/release', { tenantId: 'acme', reservationId: r.body.data.id });
      }
    } finally {
      await fleet.stop();
      await gateway.stop();
    }
  });

  it('books the per-GPU host share by default, raises smaller asks to it, and charges only what is above it', async () => {
    const plain = await h.call(acme.token, 'reservations/create', base('share-1'));
    expect(plain.body.data.request.resources).toEqual({ vcpu: 48, memoryGiB: 512, hugepages1Gi: 0 });
    const small = await h.call(
      acme.token,
      'reservations/create',
      base('share-2', { resources: { vcpu: 1 } }),
    );
    expect(small.body.data.request.resources).toMatchObject({ vcpu: 48 });
    const big = await h.call(acme.token, 'reservations/create', base('share-3', { resources: { vcpu: 64 } }));
    expect(big.body.error).toMatchObject({
      code: 'QUOTA_EXCEEDED',
      details: { resource: 'vcpu', requested: 16, limit: 0 },
    });
    await offerPool(h.t.db, { poolId, tenantId: 'acme', quota: { gpu: 64, vcpu: 16 } });
    const granted = await h.call(
      acme.token,
      'reservations/create',
      base('share-3', { resources: { vcpu: 64 } }),
    );
    expect(granted.body.data).toMatchObject({ state: 'placed', request: { resources: { vcpu: 64 } } });
    const { rows } = await sql<{
      resource: string;
      amount: string;
    }>`SELECT resource, amount FROM quota_charges WHERE reservation_id = ${granted.body.data.id} ORDER BY resource`.execute(
      h.t.db,
    );
    expect(rows.map((r) => [r.resource, Number(r.amount)])).toEqual([
      ['gpu', 2],
      ['vcpu', 16],
    ]);
    const { rows: booked } = await sql<{ resource: string; amount: string }>`
      SELECT s.resource, s.amount FROM scalar_bookings s JOIN allocations a ON a.id = s.allocation_id
      WHERE a.reservation_id = ${granted.body.data.id} ORDER BY s.resource`.execute(h.t.db);
    expect(booked.map((r) => [r.resource, Number(r.amount)])).toEqual([
      ['memoryGiB', 512],
      ['vcpu', 64],
    ]);
  });
});
