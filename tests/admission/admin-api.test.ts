import { describe, expect, it } from 'vitest';
import { seedDemo } from '../../server/seed-demo.ts';
import { useAdmissionHarness } from './harness.ts';

const h = useAdmissionHarness();

describe('the admin API', () => {
  it('lets the root admin build tenants, identities, tokens, roles and policies over HTTP', async () => {
    const tenant = await h.call(h.rootToken, 'admin/createTenant', { id: 'globex', name: 'Globex' });
    expect(tenant).toMatchObject({ status: 200, body: { data: { id: 'globex', parentId: 'platform' } } });
    const again = await h.call(h.rootToken, 'admin/createTenant', { id: 'globex', name: 'Globex' });
    expect(again.body.error.code).toBe('CONFLICT');

    const person = await h.call(h.rootToken, 'admin/createIdentity', {
      tenantId: 'globex',
      kind: 'person',
      name: 'gina',
      roles: ['member'],
    });
    expect(person.status).toBe(200);
    const token = await h.call(h.rootToken, 'admin/createToken', { identityId: person.body.data.id });
    expect(token.body.data.token).toMatch(/^bct_/);
    const whoami = await h.call(token.body.data.token, 'system/whoami', {});
    expect(whoami.body.data).toMatchObject({ tenantId: 'globex', rootAdmin: false });

    const listed = await h.call(h.rootToken, 'admin/listTokens', { identityId: person.body.data.id });
    expect(listed.body.data.tokens).toHaveLength(1);
    expect(JSON.stringify(listed.body)).not.toContain(token.body.data.token);
    expect(listed.body.data.tokens[0].lastUsedAt).toEqual(expect.any(Number));

    const role = await h.call(h.rootToken, 'admin/createRole', {
      tenantId: 'globex',
      name: 'reserver',
      actions: ['compute:reservations:create', 'compute:reservations:read'],
    });
    expect(role.status).toBe(200);
    const policy = await h.call(h.rootToken, 'admin/applyPolicy', {
      tenantId: 'globex',
      name: 'no-spot',
      document: {
        statements: [
          {
            effect: 'deny',
            actions: ['compute:reservations:create'],
            condition: { attribute: 'spot', operator: 'equals', value: true },
          },
        ],
      },
    });
    expect(policy.body.data).toMatchObject({ name: 'no-spot', version: 1 });
    const policies = await h.call(h.rootToken, 'admin/listPolicies', { tenantId: 'globex' });
    expect(policies.body.data.policies).toHaveLength(1);

    const revoked = await h.call(h.rootToken, 'admin/revokeToken', { tokenId: token.body.data.id });
    expect(revoked.status).toBe(200);
  });

  it('refuses everyone but root admins, and bad input, with exact codes', async () => {
    const { identities } = (await h.call(h.rootToken, 'admin/listIdentities', { tenantId: 'globex' })).body
      .data;
    const token = (await h.call(h.rootToken, 'admin/createToken', { identityId: identities[0].id })).body.data
      .token;
    const denied = await h.call(token, 'admin/createTenant', { name: 'Evil' });
    expect(denied).toMatchObject({ status: 403, body: { error: { code: 'ACCESS_DENIED' } } });
    const anonymous = await h.call(null, 'admin/listTenants', {});
    expect(anonymous).toMatchObject({ status: 401, body: { error: { code: 'UNAUTHENTICATED' } } });
    const unknown = await h.call(h.rootToken, 'admin/createTenant', { name: 'X', colour: 'red' });
    expect(unknown).toMatchObject({ status: 400, body: { error: { code: 'INVALID_INPUT' } } });
    expect(unknown.body.error.message).toContain('colour');
    const badPolicy = await h.call(h.rootToken, 'admin/applyPolicy', {
      tenantId: 'globex',
      name: 'bad',
      document: { statements: [{ effect: 'allow', actions: ['rm -rf'] }] },
    });
    expect(badPolicy.body.error).toMatchObject({ code: 'INVALID_INPUT' });
    expect(badPolicy.body.error.message).toContain('document.statements[0].actions[0]');
    const noHeader = await h.compute.app.request('/api/compute/admin/listTenants', {
      method: 'POST',
      headers: { authorization: `Bearer ${h.rootToken}` },
      body: '{}',
    });
    expect(noHeader.status).toBe(400);
  });

  it('seeds the demo through the admin methods, idempotently', async () => {
    const first = await seedDemo(h.compute, h.rootToken, {
      simNodes: 2,
      registerNodesDirectly: true,
      db: h.t.db,
    });
    expect(first.tenants.root.id).toBe('platform');
    expect(first.pools[0]).toMatchObject({ name: 'h100', gpuModel: 'h100', nodes: 2, gpus: 16 });
    const second = await seedDemo(h.compute, h.rootToken, {
      simNodes: 2,
      registerNodesDirectly: true,
      db: h.t.db,
    });
    expect(second.pools[0]!.id).toBe(first.pools[0]!.id);
    expect(second.siteId).toBe(first.siteId);
    const whoami = await h.call(second.tenants.acme.token, 'system/whoami', {});
    expect(whoami.body.data.tenantId).toBe('acme');
    const quotas = await h.call(h.rootToken, 'admin/listQuotas', { tenantId: 'acme' });
    const all = quotas.body.data.quotas as Array<{ poolId: string; resource: string; used: number }>;
    expect(all.filter((q) => q.poolId === first.pools[0]!.id)).toEqual([
      { poolId: first.pools[0]!.id, resource: 'gpu', limit: 16, used: 0 },
    ]);
    // Seeding twice wrote each pool's quota once (the demo also seeds the MIG and Kubernetes pools).
    expect(new Set(all.map((q) => `${q.poolId}/${q.resource}`)).size).toBe(all.length);
    expect(all.every((q) => q.used === 0)).toBe(true);
  });
});
