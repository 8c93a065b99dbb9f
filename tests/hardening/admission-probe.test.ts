import { describe, expect, it } from 'vitest';
import { createApiFixture } from '../support/api.ts';

describe('probe', () => {
  it('probes', async () => {
    const api = await createApiFixture();
    try {
      const t = api.root.token;
      const calls: Array<[string, unknown]> = [
        ['admin/createTenant', { name: 'x', parentId: 'nope' }],
        ['admin/createTenant', { id: 'self', name: 'x', parentId: 'self' }],
        ['admin/createIdentity', { tenantId: 'nope', kind: 'person', name: 'a' }],
        ['admin/createIdentity', { tenantId: 'platform', kind: 'agent', name: 'a', personIdentityId: 'idn_x' }],
        ['admin/createToken', { identityId: 'idn_nope' }],
        ['admin/revokeToken', { tokenId: 'tok_nope' }],
        ['admin/createRole', { tenantId: 'nope', name: 'r', actions: ['compute:*'] }],
        ['admin/bindRole', { identityId: 'idn_nope', role: 'member' }],
        ['admin/bindRole', { identityId: api.root.identityId, role: 'member', tenantId: 'nope' }],
        ['admin/applyPolicy', { tenantId: 'nope', name: 'p', document: { statements: [] } }],
        ['admin/setBudget', { tenantId: 'nope', limit: 1 }],
        ['admin/listIdentities', { tenantId: 'nope' }],
        ['admin/listPolicies', { tenantId: 'nope' }],
        ['admin/listTokens', { tenantId: 'nope' }],
        ['confirmations/approve', { confirmationId: 'cnf_nope' }],
      ];
      for (const [path, body] of calls) {
        const r = await api.call(t, path, body);
        console.log(path, JSON.stringify(body), r.status, JSON.stringify(r.body).slice(0, 300));
      }
    } finally {
      await api.stop();
    }
    expect(1).toBe(1);
  });
});
