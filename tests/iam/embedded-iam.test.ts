import { beforeAll, describe, expect, it } from 'vitest';
import type { Principal, ResourceRef } from '../../core/iam-port.ts';
import { advanceComputeClock } from '../../db/clock.ts';
import { iamDatabase } from '../../db/iam/iam-db.ts';
import { insertRoleBinding } from '../../db/iam/roles.ts';
import { insertTenant } from '../../db/iam/tenants.ts';
import { bootstrapPlatform } from '../../iam/bootstrap.ts';
import { createEmbeddedIam, type EmbeddedIam } from '../../iam/embedded/index.ts';
import { useTestDatabase } from '../support/database.ts';
import { boundedH100Policy } from '../support/iam.ts';
import { testLogger } from '../support/logger.ts';

const t = useTestDatabase({ max: 5 });
let iam: EmbeddedIam;
let root: Awaited<ReturnType<typeof bootstrapPlatform>>;

function reservation(attributes: Record<string, unknown>, id = 'rsv_x'): ResourceRef {
  return { type: 'compute-reservation', id, tenantId: 'acme', attributes };
}

beforeAll(async () => {
  iam = createEmbeddedIam({ db: t.db, log: testLogger() });
  root = await bootstrapPlatform(iam);
});

describe('the embedded IAM', () => {
  it('bootstraps the platform idempotently and authenticates its admin as root admin', async () => {
    const again = await bootstrapPlatform(iam);
    expect(again.rootTenantId).toBe(root.rootTenantId);
    expect(again.rootAdminIdentityId).toBe(root.rootAdminIdentityId);
    expect(again.rootAdminToken).not.toBe(root.rootAdminToken);
    for (const token of [root.rootAdminToken, again.rootAdminToken]) {
      const principal = await iam.authenticate({ token });
      expect(principal).toMatchObject({ tenantId: 'platform', rootAdmin: true, sessionKind: 'direct' });
    }
  });

  it('stores tokens hashed, records last use, and refuses revoked or unknown ones', async () => {
    await iam.admin.createTenant({ id: 'acme', name: 'Acme' });
    const person = await iam.admin.createIdentity({ tenantId: 'acme', kind: 'person', name: 'ada' });
    const token = await iam.admin.createToken({ identityId: person.id, name: 'laptop' });
    const { rows } = await t.pool.query('SELECT secret_hash FROM iam.tokens WHERE id = $1', [token.id]);
    expect(rows[0].secret_hash).not.toContain(token.token);
    const principal = await iam.authenticate({ token: token.token });
    expect(principal).toMatchObject({ identityId: person.id, tenantId: 'acme', rootAdmin: false });
    const [listed] = await iam.admin.listTokens({ identityId: person.id });
    expect(listed!.lastUsedAt).toBeInstanceOf(Date);
    expect(listed).not.toHaveProperty('token');
    await iam.admin.revokeToken(token.id);
    await expect(iam.authenticate({ token: token.token })).rejects.toMatchObject({ code: 'UNAUTHENTICATED' });
    await expect(iam.authenticate({ token: 'bct_nope' })).rejects.toMatchObject({ code: 'UNAUTHENTICATED' });
  });

  it('denies by default, allows through roles, keeps tenants apart, and lets deny win', async () => {
    const bob = await iam.admin.createIdentity({ tenantId: 'acme', kind: 'person', name: 'bob' });
    const principal = await iam.authenticate({
      token: (await iam.admin.createToken({ identityId: bob.id })).token,
    });
    const small = reservation({ gpuModel: 'h100', gpuCount: 4, durationHours: 8, region: 'eu-central-1' });
    expect((await iam.authorize(principal, 'compute:reservations:create', small)).allowed).toBe(false);
    await iam.admin.bindRole({ identityId: bob.id, role: 'member' });
    expect((await iam.authorize(principal, 'compute:reservations:create', small)).allowed).toBe(true);
    expect((await iam.authorize(principal, 'compute:admin:write', small)).allowed).toBe(false);
    await iam.admin.createTenant({ id: 'globex', name: 'Globex' });
    const foreign = { ...small, tenantId: 'globex' };
    expect((await iam.authorize(principal, 'compute:reservations:create', foreign)).allowed).toBe(false);

    await iam.admin.applyPolicy({ tenantId: 'acme', name: 'h100-limits', document: boundedH100Policy });
    const cases: Array<[Record<string, unknown>, boolean]> = [
      [{ gpuModel: 'h100', gpuCount: 8, durationHours: 72, region: 'eu-west-1' }, true],
      [{ gpuModel: 'h100', gpuCount: 9, durationHours: 8, region: 'eu-west-1' }, false],
      [{ gpuModel: 'h100', gpuCount: 4, durationHours: 72.001, region: 'eu-west-1' }, false],
      [{ gpuModel: 'h100', gpuCount: 4, durationHours: 8, region: 'us-east-1' }, false],
      [{ gpuModel: 'a100', gpuCount: 64, durationHours: 500, region: 'us-east-1' }, true],
    ];
    for (const [attributes, allowed] of cases) {
      const decision = await iam.authorize(principal, 'compute:reservations:create', reservation(attributes));
      expect({ attributes, allowed: decision.allowed }).toEqual({ attributes, allowed });
    }
    await expect(
      iam.require(principal, 'compute:reservations:create', reservation({ gpuModel: 'h100', gpuCount: 16 })),
    ).rejects.toMatchObject({ code: 'ACCESS_DENIED', message: expect.stringContaining('h100-limits v1') });
    // A new version replaces the old one.
    const v2 = await iam.admin.applyPolicy({
      tenantId: 'acme',
      name: 'h100-limits',
      document: { statements: [{ effect: 'deny', actions: ['compute:reservations:create'] }] },
    });
    expect(v2.version).toBe(2);
    expect((await iam.authorize(principal, 'compute:reservations:create', small)).allowed).toBe(false);
    await iam.admin.applyPolicy({ tenantId: 'acme', name: 'h100-limits', document: boundedH100Policy });
  });

  it('refuses malformed policy documents with the field named', async () => {
    await expect(
      iam.admin.applyPolicy({
        tenantId: 'acme',
        name: 'bad',
        document: { statements: [{ effect: 'maybe', actions: ['compute:*'] }] },
      }),
    ).rejects.toMatchObject({
      code: 'INVALID_INPUT',
      message: expect.stringContaining('document.statements.0.effect'),
    });
  });

  it('holds a delegated agent for its person and lets the person approve or deny', async () => {
    const person = await iam.admin.createIdentity({ tenantId: 'acme', kind: 'person', name: 'carol' });
    await iam.admin.bindRole({ identityId: person.id, role: 'member' });
    const agent = await iam.admin.createIdentity({
      tenantId: 'acme',
      kind: 'agent',
      name: 'carols-agent',
      personIdentityId: person.id,
      confirmActions: ['compute:reservations:create'],
    });
    await iam.admin.bindRole({ identityId: agent.id, role: 'member' });
    const principal: Principal = await iam.authenticate({
      token: (await iam.admin.createToken({ identityId: agent.id })).token,
    });
    expect(principal.sessionKind).toBe('delegated');
    const resource = reservation(
      { gpuModel: 'h100', gpuCount: 1, durationHours: 1, region: 'eu-west-1' },
      'rsv_a',
    );
    const error = await iam.require(principal, 'compute:reservations:create', resource).catch((e) => e);
    expect(error).toMatchObject({ code: 'CONFIRMATION_REQUIRED' });
    const { confirmationId, expiresAt } = error.details;
    expect(expiresAt - Date.now()).toBeLessThanOrEqual(30 * 60_000 + 5_000);
    // Asking again returns the same open confirmation.
    const again = await iam.require(principal, 'compute:reservations:create', resource).catch((e) => e);
    expect(again.details.confirmationId).toBe(confirmationId);
    await expect(
      iam.admin.decideConfirmation({ confirmationId, personIdentityId: agent.id, decision: 'approved' }),
    ).rejects.toMatchObject({ code: 'NOT_FOUND' });
    await iam.admin.decideConfirmation({ confirmationId, personIdentityId: person.id, decision: 'approved' });
    await expect(iam.require(principal, 'compute:reservations:create', resource)).resolves.toBeUndefined();
    // Reads are not held.
    expect((await iam.authorize(principal, 'compute:reservations:read', resource)).allowed).toBe(true);

    const other = reservation({ gpuModel: 'a100', gpuCount: 1 }, 'rsv_b');
    const held = await iam.require(principal, 'compute:reservations:create', other).catch((e) => e);
    await iam.admin.decideConfirmation({
      confirmationId: held.details.confirmationId,
      personIdentityId: person.id,
      decision: 'denied',
    });
    await expect(iam.require(principal, 'compute:reservations:create', other)).rejects.toMatchObject({
      code: 'ACCESS_DENIED',
    });
  });

  it('records usage idempotently by key and answers billingCheck from the budget', async () => {
    expect(await iam.billingCheck('acme')).toEqual({ allowed: true });
    await iam.admin.setBudget({ tenantId: 'acme', limit: 10 });
    const record = {
      idempotencyKey: 'alloc_1:2026-11-29T00',
      tenantId: 'acme',
      meter: 'gpu.h100.hours',
      quantity: 6,
      windowStart: new Date(),
      windowEnd: new Date(Date.now() + 3_600_000),
      subject: 'rsv_1',
    };
    await iam.recordUsage([record]);
    await iam.recordUsage([record]);
    expect(await iam.billingCheck('acme', 'gpu.h100.hours')).toMatchObject({ allowed: true, remaining: 4 });
    await iam.recordUsage([{ ...record, idempotencyKey: 'alloc_1:2026-11-29T01' }]);
    expect(await iam.billingCheck('acme', 'gpu.h100.hours')).toMatchObject({ allowed: false, remaining: 0 });
  });

  it('expires a confirmation after its deadline', async () => {
    const person = (await iam.admin.listIdentities('acme')).find((i) => i.name === 'carol')!;
    const agent = (await iam.admin.listIdentities('acme')).find((i) => i.name === 'carols-agent')!;
    const principal = await iam.authenticate({
      token: (await iam.admin.createToken({ identityId: agent.id })).token,
    });
    const resource = reservation({ gpuModel: 'a100', gpuCount: 1 }, 'rsv_c');
    const held = await iam.require(principal, 'compute:reservations:create', resource).catch((e) => e);
    await advanceComputeClock(t.db, 31 * 60_000);
    await expect(
      iam.admin.decideConfirmation({
        confirmationId: held.details.confirmationId,
        personIdentityId: person.id,
        decision: 'approved',
      }),
    ).rejects.toMatchObject({ code: 'INVALID_STATE' });
    await advanceComputeClock(t.db, -31 * 60_000);
  });
});

describe('approvals, delegations and refusals', () => {
  /** A person of acme with the member role, and an agent acting for them that holds `confirm`. */
  async function delegatedAgent(name: string, confirm: string[]) {
    const person = await iam.admin.createIdentity({
      tenantId: 'acme',
      kind: 'person',
      name: `${name}-person`,
    });
    await iam.admin.bindRole({ identityId: person.id, role: 'member' });
    const agent = await iam.admin.createIdentity({
      tenantId: 'acme',
      kind: 'agent',
      name: `${name}-agent`,
      personIdentityId: person.id,
      confirmActions: confirm,
    });
    await iam.admin.bindRole({ identityId: agent.id, role: 'member' });
    const token = (await iam.admin.createToken({ identityId: agent.id })).token;
    return { person, agent, token, principal: await iam.authenticate({ token }) };
  }
  const approve = (confirmationId: string, personIdentityId: string) =>
    iam.admin.decideConfirmation({ confirmationId, personIdentityId, decision: 'approved' });

  it('lets an approval admit only the request it was asked for, and only once', async () => {
    const { person, principal } = await delegatedAgent('dana', ['compute:reservations:extend']);
    const resource = reservation({ gpuModel: 'a100', gpuCount: 1, durationHours: 2 }, 'rsv_once');
    const action = 'compute:reservations:extend';
    const asked = { requestHash: 'hash-by-1h' };
    const held = await iam.require(principal, action, resource, asked).catch((e) => e);
    expect(held).toMatchObject({ code: 'CONFIRMATION_REQUIRED' });
    const confirmationId = held.details.confirmationId;
    expect((await approve(confirmationId, person.id)).state).toBe('approved');
    // Approving twice is refused, and changes nothing.
    await expect(approve(confirmationId, person.id)).rejects.toMatchObject({ code: 'INVALID_STATE' });

    // Another request on the same resource is not admitted by it: it asks for its own approval.
    const other = await iam
      .require(principal, action, resource, { requestHash: 'hash-by-80h' })
      .catch((e) => e);
    expect(other).toMatchObject({ code: 'CONFIRMATION_REQUIRED' });
    expect(other.details.confirmationId).not.toBe(confirmationId);
    // Nor is a request that names none.
    const unnamed = await iam.require(principal, action, resource).catch((e) => e);
    expect(unnamed).toMatchObject({ code: 'CONFIRMATION_REQUIRED' });

    // authorize only answers; require uses the approval up, once.
    expect((await iam.authorize(principal, action, resource, asked)).allowed).toBe(true);
    expect((await iam.authorize(principal, action, resource, asked)).allowed).toBe(true);
    await expect(iam.require(principal, action, resource, asked)).resolves.toBeUndefined();
    const replay = await iam.require(principal, action, resource, asked).catch((e) => e);
    expect(replay).toMatchObject({ code: 'CONFIRMATION_REQUIRED' });
    expect(replay.details.confirmationId).not.toBe(confirmationId);
    const { rows } = await t.pool.query(
      'SELECT id, state, used_at IS NOT NULL AS used, request_hash FROM iam.confirmations WHERE resource_id = $1 ORDER BY created_at',
      ['rsv_once'],
    );
    expect(rows).toEqual([
      { id: confirmationId, state: 'approved', used: true, request_hash: 'hash-by-1h' },
      { id: other.details.confirmationId, state: 'pending', used: false, request_hash: 'hash-by-80h' },
      { id: unnamed.details.confirmationId, state: 'pending', used: false, request_hash: null },
      { id: replay.details.confirmationId, state: 'pending', used: false, request_hash: 'hash-by-1h' },
    ]);
  });

  it('admits one of two concurrent decisions an approval allows', async () => {
    const { person, principal } = await delegatedAgent('eve', ['compute:reservations:create']);
    const resource = reservation({ gpuModel: 'a100', gpuCount: 1 }, 'rsv_race');
    const asked = { requestHash: 'hash-race' };
    const held = await iam.require(principal, 'compute:reservations:create', resource, asked).catch((e) => e);
    await approve(held.details.confirmationId, person.id);
    const results = await Promise.allSettled(
      Array.from({ length: 4 }, () => iam.require(principal, 'compute:reservations:create', resource, asked)),
    );
    expect(results.filter((r) => r.status === 'fulfilled')).toHaveLength(1);
    for (const r of results.filter((r) => r.status === 'rejected')) {
      expect((r as PromiseRejectedResult).reason).toMatchObject({ code: 'CONFIRMATION_REQUIRED' });
    }
  });

  it('makes a revoked delegation fail its agent’s tokens, never a direct session', async () => {
    const { agent, token, principal } = await delegatedAgent('finn', []);
    expect(principal).toMatchObject({
      sessionKind: 'delegated',
      delegation: { delegationId: agent.delegationId },
    });
    const resource = reservation({ gpuModel: 'a100', gpuCount: 1 }, 'rsv_revoked');
    await expect(iam.require(principal, 'compute:reservations:create', resource)).resolves.toBeUndefined();

    const revoked = await iam.admin.revokeDelegation(agent.delegationId!);
    expect(revoked).toMatchObject({ id: agent.delegationId, agentIdentityId: agent.id });
    expect((await iam.admin.revokeDelegation(agent.delegationId!)).revokedAt).toEqual(revoked.revokedAt);
    await expect(iam.authenticate({ token })).rejects.toMatchObject({ code: 'UNAUTHENTICATED' });
    // A principal authenticated before the revocation (an API's cached authentication) is refused too.
    for (const decision of [
      () => iam.require(principal, 'compute:reservations:create', resource),
      () => iam.require(principal, 'compute:reservations:read', resource),
      () => iam.authorize(principal, 'compute:reservations:read', resource),
    ]) {
      await expect(decision()).rejects.toMatchObject({ code: 'UNAUTHENTICATED' });
    }
    await expect(iam.admin.createToken({ identityId: agent.id })).rejects.toMatchObject({
      code: 'INVALID_STATE',
    });
    await expect(iam.admin.revokeDelegation('dlg_nope')).rejects.toMatchObject({ code: 'NOT_FOUND' });
  });

  it('says what was denied and whom to ask, naming no other tenant’s policies or identities', async () => {
    const member = await iam.admin.createIdentity({ tenantId: 'acme', kind: 'person', name: 'gil' });
    await iam.admin.bindRole({ identityId: member.id, role: 'viewer' });
    const principal = await iam.authenticate({
      token: (await iam.admin.createToken({ identityId: member.id })).token,
    });
    const resource = reservation({ gpuModel: 'a100', gpuCount: 1 }, 'rsv_gil');
    const ungranted = await iam.require(principal, 'compute:reservations:create', resource).catch((e) => e);
    expect(ungranted).toMatchObject({
      code: 'ACCESS_DENIED',
      details: { resourceType: 'compute-reservation' },
    });
    expect(ungranted.message).toContain('compute:reservations:create on compute-reservation');
    expect(ungranted.message).toContain('ask an administrator of tenant acme');
    expect(ungranted.message).toContain('built-in: member or admin');

    // The platform's own policy stops it: the tenant's member is told a policy above it did, not which.
    await iam.admin.bindRole({ identityId: member.id, role: 'member' });
    const platformPolicy = await iam.admin.applyPolicy({
      tenantId: 'platform',
      name: 'platform-secret-freeze',
      document: {
        statements: [
          {
            sid: 'FreezeA100',
            effect: 'deny',
            actions: ['compute:reservations:create'],
            condition: { attribute: 'gpuModel', operator: 'equals', value: 'a100' },
          },
        ],
      },
    });
    const frozen = await iam.require(principal, 'compute:reservations:create', resource).catch((e) => e);
    expect(frozen.code).toBe('ACCESS_DENIED');
    expect(frozen.message).toContain('a policy set outside your tenant');
    expect(JSON.stringify(frozen)).not.toMatch(/platform-secret-freeze|FreezeA100/);
    expect(JSON.stringify(frozen)).not.toContain(platformPolicy.id);
    expect(JSON.stringify(frozen)).not.toContain(root.rootAdminIdentityId);
    // The platform's administrator may read its name.
    const admin = await iam.authenticate({ token: root.rootAdminToken });
    const toAdmin = await iam.require(admin, 'compute:reservations:create', resource).catch((e) => e);
    expect(toAdmin.message).toContain('platform-secret-freeze');
    await iam.admin.applyPolicy({
      tenantId: 'platform',
      name: 'platform-secret-freeze',
      document: { statements: [{ effect: 'deny', actions: ['compute:nothing:x'] }] },
    });

    // Another tenant's member acting on acme hears nothing of acme's policies or identities.
    const stranger = await iam.admin.createIdentity({ tenantId: 'globex', kind: 'person', name: 'hal' });
    await iam.admin.bindRole({ identityId: stranger.id, role: 'admin' });
    const foreign = await iam.authenticate({
      token: (await iam.admin.createToken({ identityId: stranger.id })).token,
    });
    const crossed = await iam
      .require(foreign, 'compute:reservations:create', {
        ...reservation({ gpuModel: 'h100', gpuCount: 16 }, 'rsv_acme'),
        ownerIdentityId: member.id,
      })
      .catch((e) => e);
    expect(crossed.code).toBe('ACCESS_DENIED');
    expect(crossed.message).toContain('your tenant globex is neither tenant acme nor above it');
    expect(JSON.stringify(crossed)).not.toMatch(/h100-limits|pol_|idn_/);
  });

  it('turns a reference to a tenant, identity or role that does not exist into NOT_FOUND', async () => {
    const db = iamDatabase(t.db);
    await expect(insertTenant(db, { id: 'orphan', name: 'Orphan', parentId: 'nope' })).rejects.toMatchObject({
      code: 'NOT_FOUND',
      message: 'parentId: tenant nope does not exist',
    });
    const someone = (await iam.admin.listIdentities('acme'))[0]!;
    await expect(
      insertRoleBinding(db, { identityId: someone.id, roleId: 'role_nope', tenantId: 'acme' }),
    ).rejects.toMatchObject({ code: 'NOT_FOUND', message: 'role: role role_nope does not exist' });
    await expect(
      insertRoleBinding(db, { identityId: 'idn_nope', roleId: 'role_member', tenantId: 'acme' }),
    ).rejects.toMatchObject({ code: 'NOT_FOUND', message: 'identityId: identity idn_nope does not exist' });
    await expect(iam.admin.createTenant({ name: 'Orphan', parentId: 'nope' })).rejects.toMatchObject({
      code: 'NOT_FOUND',
    });
  });
});
