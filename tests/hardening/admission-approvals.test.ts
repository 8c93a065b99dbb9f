import { sql } from 'kysely';
import { beforeAll, describe, expect, it } from 'vitest';
import { h100Pool, type TenantFixture, tenantWithMember } from '../admission/fixtures.ts';
import { useAdmissionHarness } from '../admission/harness.ts';

// Hardening (issue 17): an approval admits the exact request it approved, once; a revoked delegation
// fails its agent's token; ACCESS_DENIED names nothing of another tenant; a missing parent is NOT_FOUND.

const h = useAdmissionHarness();
let acme: TenantFixture;
let globex: TenantFixture;
let poolId: string;
const hour = 3_600_000;

beforeAll(async () => {
  acme = await tenantWithMember(h, 'acme');
  globex = await tenantWithMember(h, 'globex', { role: 'admin' });
  poolId = (await h100Pool(h, { nodes: 2, tenants: ['acme', 'globex'], gpuQuota: 64 })).poolId;
});

/** A person of acme (member) and an agent acting for them, holding `confirmActions` for them. */
async function agentFor(name: string, confirmActions: string[]) {
  const person = await h.iam.admin.createIdentity({ tenantId: 'acme', kind: 'person', name });
  await h.iam.admin.bindRole({ identityId: person.id, role: 'member' });
  const personToken = (await h.iam.admin.createToken({ identityId: person.id })).token;
  const agent = await h.iam.admin.createIdentity({
    tenantId: 'acme',
    kind: 'agent',
    name: `${name}-agent`,
    personIdentityId: person.id,
    confirmActions,
  });
  await h.iam.admin.bindRole({ identityId: agent.id, role: 'member' });
  const agentToken = (await h.iam.admin.createToken({ identityId: agent.id })).token;
  return { person, personToken, agent, agentToken };
}

const create = (token: string, key: string) =>
  h.call(token, 'reservations/create', {
    tenantId: 'acme',
    poolId,
    devices: [{ class: 'gpu', count: 1 }],
    duration: '2h',
    idempotencyKey: key,
  });

const extend = (token: string, reservationId: string, key: string, by: string) =>
  h.call(token, 'reservations/extend', { tenantId: 'acme', reservationId, idempotencyKey: key, by });

describe('a delegated approval', () => {
  it('admits the very request it approved, once; never another request or a replay', async () => {
    const { personToken, agentToken } = await agentFor('ines', ['compute:reservations:extend']);
    const r = (await create(agentToken, 'approved-1')).body.data;
    const end = r.during.end;
    const asked = await extend(agentToken, r.id, 'by-1h', '1h');
    expect(asked.body.error).toMatchObject({ code: 'CONFIRMATION_REQUIRED' });
    const confirmationId = asked.body.error.details.confirmationId;
    const approved = await h.call(personToken, 'confirmations/approve', { confirmationId });
    expect(approved.body.data).toMatchObject({ id: confirmationId, state: 'approved' });
    const twice = await h.call(personToken, 'confirmations/approve', { confirmationId });
    expect(twice.body.error).toMatchObject({ code: 'INVALID_STATE' });
    // An extend of a reservation is not an awaiting admission: its lifecycle hears nothing of it.
    expect(h.lifecycle.signals.filter((s) => s.reservationId === r.id)).toEqual([]);

    // Another request does not ride on the approval: it asks for its own.
    const bigger = await extend(agentToken, r.id, 'by-5h', '5h');
    expect(bigger.body.error).toMatchObject({ code: 'CONFIRMATION_REQUIRED' });
    expect(bigger.body.error.details.confirmationId).not.toBe(confirmationId);
    // Nor the same key with another body.
    const reused = await extend(agentToken, r.id, 'by-1h', '3h');
    expect(reused.body.error).toMatchObject({ code: 'CONFIRMATION_REQUIRED' });
    const view = await h.call(agentToken, 'reservations/get', { tenantId: 'acme', reservationId: r.id });
    expect(view.body.data.during.end).toBe(end);

    // The approved request is admitted; retried with its key it answers the same extend.
    const done = await extend(agentToken, r.id, 'by-1h', '1h');
    expect(done.body.data).toMatchObject({ extended: true, reservation: { during: { end: end + hour } } });
    const retried = await extend(agentToken, r.id, 'by-1h', '1h');
    expect(retried.body.data).toMatchObject({ extended: true, reservation: { during: { end: end + hour } } });
    // The same request under a fresh key is a new extend: the used approval does not admit it.
    const replay = await extend(agentToken, r.id, 'by-1h-again', '1h');
    expect(replay.body.error).toMatchObject({ code: 'CONFIRMATION_REQUIRED' });
    expect(replay.body.error.details.confirmationId).not.toBe(confirmationId);
    const after = await h.call(agentToken, 'reservations/get', { tenantId: 'acme', reservationId: r.id });
    expect(after.body.data.during.end).toBe(end + hour);
    const { rows } = await sql<{ n: string }>`
      SELECT count(*) AS n FROM iam.confirmations WHERE resource_id = ${r.id} AND used_at IS NOT NULL`.execute(
      h.t.db,
    );
    expect(Number(rows[0]!.n)).toBe(1);
    await h.call(acme.token, 'reservations/release', { tenantId: 'acme', reservationId: r.id });
  });

  it('admits a held create once it is approved, and the same key never decides it twice', async () => {
    const { personToken, agentToken } = await agentFor('jon', ['compute:reservations:create']);
    const held = await create(agentToken, 'held-1');
    expect(held.body.error).toMatchObject({ code: 'CONFIRMATION_REQUIRED' });
    const { confirmationId, reservationId } = held.body.error.details;
    // The same key with another body is refused before any decision.
    const other = await h.call(agentToken, 'reservations/create', {
      tenantId: 'acme',
      poolId,
      devices: [{ class: 'gpu', count: 4 }],
      duration: '2h',
      idempotencyKey: 'held-1',
    });
    expect(other.body.error).toMatchObject({ code: 'CONFLICT', details: { reservationId } });
    await h.call(personToken, 'confirmations/approve', { confirmationId });
    expect(h.lifecycle.signals).toContainEqual({
      reservationId,
      signal: { type: 'confirmation', decision: 'approved' },
    });
    const placed = await create(agentToken, 'held-1');
    expect(placed.body.data).toMatchObject({ id: reservationId, state: 'placed' });
    const decisions = h.decisions.length;
    const again = await create(agentToken, 'held-1');
    expect(again.body.data).toMatchObject({ id: reservationId, state: 'placed' });
    expect(h.decisions.length).toBe(decisions);
    await h.call(acme.token, 'reservations/release', { tenantId: 'acme', reservationId });
  });
});

describe('a revoked delegation', () => {
  it("fails the agent's token with UNAUTHENTICATED, never a direct session", async () => {
    const { agent, agentToken } = await agentFor('kim', []);
    const before = await create(agentToken, 'before-revoke');
    expect(before.body.data.state).toBe('placed');
    const revoked = await h.call(h.rootToken, 'admin/revokeDelegation', { delegationId: agent.delegationId });
    expect(revoked.body.data).toMatchObject({ id: agent.delegationId, agentIdentityId: agent.id });
    // The API's authentication of the token may still be cached: the decision refuses it anyway.
    for (const [path, body] of [
      [
        'reservations/create',
        {
          tenantId: 'acme',
          poolId,
          devices: [{ class: 'gpu', count: 1 }],
          duration: '1h',
          idempotencyKey: 'after-revoke',
        },
      ],
      ['reservations/get', { tenantId: 'acme', reservationId: before.body.data.id }],
      ['reservations/release', { tenantId: 'acme', reservationId: before.body.data.id }],
    ] as const) {
      const res = await h.call(agentToken, path, body);
      expect({ path, status: res.status, code: res.body.error?.code }).toEqual({
        path,
        status: 401,
        code: 'UNAUTHENTICATED',
      });
    }
    await expect(h.iam.authenticate({ token: agentToken })).rejects.toMatchObject({
      code: 'UNAUTHENTICATED',
    });
    const minted = await h.call(h.rootToken, 'admin/createToken', { identityId: agent.id });
    expect(minted.body.error).toMatchObject({ code: 'INVALID_STATE' });
    const unknown = await h.call(h.rootToken, 'admin/revokeDelegation', { delegationId: 'dlg_nope' });
    expect(unknown.body.error).toMatchObject({ code: 'NOT_FOUND' });
    const stillPlaced = await h.call(acme.token, 'reservations/get', {
      tenantId: 'acme',
      reservationId: before.body.data.id,
    });
    expect(stillPlaced.body.data.state).toBe('placed');
    await h.call(acme.token, 'reservations/release', {
      tenantId: 'acme',
      reservationId: before.body.data.id,
    });
  });
});

describe('ACCESS_DENIED', () => {
  it("names the action, the resource type and whom to ask, and nothing of another tenant's", async () => {
    const policy = await h.iam.admin.applyPolicy({
      tenantId: 'acme',
      name: 'acme-private-limits',
      document: {
        statements: [{ sid: 'AcmeNoLong', effect: 'deny', actions: ['compute:reservations:extend'] }],
      },
    });
    const r = (await create(acme.token, 'mine-1')).body.data;
    // acme's own member hears its own tenant's policy.
    const own = await extend(acme.token, r.id, 'own-1', '1h');
    expect(own.body.error.code).toBe('ACCESS_DENIED');
    expect(own.body.error.message).toContain('compute:reservations:extend on compute-reservation');
    expect(own.body.error.message).toContain('acme-private-limits');
    expect(own.body.error.details).toMatchObject({
      resourceType: 'compute-reservation',
      policyIds: [policy.id],
    });

    // A globex administrator reaching for acme's reservation learns nothing of acme's.
    for (const [path, body] of [
      ['reservations/extend', { tenantId: 'acme', reservationId: r.id, idempotencyKey: 'x-1', by: '1h' }],
      ['reservations/get', { tenantId: 'acme', reservationId: r.id }],
      ['reservations/release', { tenantId: 'acme', reservationId: r.id }],
      [
        'reservations/create',
        {
          tenantId: 'acme',
          poolId,
          devices: [{ class: 'gpu', count: 1 }],
          duration: '1h',
          idempotencyKey: 'x-2',
        },
      ],
    ] as const) {
      const res = await h.call(globex.token, path, body);
      expect({ path, code: res.body.error?.code }).toEqual({ path, code: 'ACCESS_DENIED' });
      const told = JSON.stringify(res.body.error);
      for (const secret of ['acme-private-limits', 'AcmeNoLong', policy.id, acme.identityId]) {
        expect({ path, leaks: told.includes(secret) }).toEqual({ path, leaks: false });
      }
    }
    // Nor does the reservation under globex's own tenant id: it is not there.
    const asGlobex = await h.call(globex.token, 'reservations/get', {
      tenantId: 'globex',
      reservationId: r.id,
    });
    expect(asGlobex.body.error.code).toBe('NOT_FOUND');
    await h.iam.admin.applyPolicy({
      tenantId: 'acme',
      name: 'acme-private-limits',
      document: { statements: [{ effect: 'deny', actions: ['compute:nothing:x'] }] },
    });
    await h.call(acme.token, 'reservations/release', { tenantId: 'acme', reservationId: r.id });
  });
});

describe('references to what does not exist', () => {
  it('answers NOT_FOUND (never INTERNAL) for an unknown parent, tenant, identity or role', async () => {
    const cases: Array<[string, Record<string, unknown>]> = [
      ['admin/createTenant', { name: 'Orphan', parentId: 'no-such-parent' }],
      ['admin/createIdentity', { tenantId: 'no-such-tenant', kind: 'person', name: 'x' }],
      ['admin/createIdentity', { tenantId: 'acme', kind: 'agent', name: 'x', personIdentityId: 'idn_nope' }],
      [
        'admin/createIdentity',
        { tenantId: 'acme', kind: 'person', name: 'half-made', roles: ['member', 'no-such-role'] },
      ],
      ['admin/createToken', { identityId: 'idn_nope' }],
      ['admin/createRole', { tenantId: 'no-such-tenant', name: 'r', actions: ['compute:*'] }],
      ['admin/bindRole', { identityId: 'idn_nope', role: 'member' }],
      ['admin/bindRole', { identityId: acme.identityId, role: 'no-such-role' }],
      ['admin/bindRole', { identityId: acme.identityId, role: 'member', tenantId: 'no-such-tenant' }],
      [
        'admin/applyPolicy',
        {
          tenantId: 'no-such-tenant',
          name: 'p',
          document: { statements: [{ effect: 'deny', actions: ['compute:*'] }] },
        },
      ],
      ['admin/setBudget', { tenantId: 'no-such-tenant', limit: 1 }],
      ['admin/revokeToken', { tokenId: 'tok_nope' }],
      ['admin/revokeDelegation', { delegationId: 'dlg_nope' }],
      ['confirmations/approve', { confirmationId: 'cnf_nope' }],
    ];
    for (const [path, body] of cases) {
      const res = await h.call(h.rootToken, path, body);
      expect({ path, body, status: res.status, code: res.body.error?.code }).toEqual({
        path,
        body,
        status: 404,
        code: 'NOT_FOUND',
      });
    }
    const orphan = await h.call(h.rootToken, 'admin/createTenant', {
      name: 'Orphan',
      parentId: 'no-such-parent',
    });
    expect(orphan.body.error.message).toContain('no-such-parent');
    const { rows } = await sql`SELECT 1 FROM iam.tenants WHERE name = 'Orphan'`.execute(h.t.db);
    expect(rows).toHaveLength(0);
    // A refused createIdentity made nothing, not even the identity its roles were for.
    const { rows: identities } = await sql`SELECT 1 FROM iam.identities WHERE name = 'half-made'`.execute(
      h.t.db,
    );
    expect(identities).toHaveLength(0);
    const made = await h.call(h.rootToken, 'admin/createIdentity', {
      tenantId: 'acme',
      kind: 'service',
      name: 'with-roles',
      roles: ['viewer', 'member'],
    });
    const { rows: bindings } = await sql<{ role_id: string }>`
      SELECT role_id FROM iam.role_bindings WHERE identity_id = ${made.body.data.id} ORDER BY role_id`.execute(
      h.t.db,
    );
    expect(bindings.map((b) => b.role_id)).toEqual(['role_member', 'role_viewer']);
  });
});
