import { beforeAll, describe, expect, it } from 'vitest';
import type { Principal, ResourceRef } from '../../core/iam-port.ts';
import { advanceComputeClock } from '../../db/clock.ts';
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
