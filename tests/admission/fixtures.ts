import { insertPool, insertSite, offerPool, registerReadyNodes } from '../../db/nodes/fleet.ts';
import type { AdmissionHarness } from './harness.ts';

export interface TenantFixture {
  id: string;
  identityId: string;
  token: string;
}

/** A tenant with one identity bound to `role` (default member) and a token for it. */
export async function tenantWithMember(
  h: AdmissionHarness,
  tenantId: string,
  options: { role?: string; name?: string; kind?: 'person' | 'service' } = {},
): Promise<TenantFixture> {
  if (!(await h.iam.admin.getTenant(tenantId)))
    await h.iam.admin.createTenant({ id: tenantId, name: tenantId });
  const identity = await h.iam.admin.createIdentity({
    tenantId,
    kind: options.kind ?? 'person',
    name: options.name ?? `${tenantId}-user`,
  });
  await h.iam.admin.bindRole({ identityId: identity.id, role: options.role ?? 'member' });
  const token = await h.iam.admin.createToken({ identityId: identity.id });
  return { id: tenantId, identityId: identity.id, token: token.token };
}

/** A site and an H100 pool of `nodes` ready 8-GPU nodes, offered to `tenants` with `gpuQuota` each. */
export async function h100Pool(
  h: AdmissionHarness,
  input: {
    nodes: number;
    tenants: string[];
    gpuQuota: number;
    region?: string;
    name?: string;
    policy?: Record<string, unknown>;
  },
) {
  const name = input.name ?? 'h100';
  const siteId = await insertSite(h.t.db, { name: `site-${name}`, region: input.region ?? 'eu-central-1' });
  const poolId = await insertPool(h.t.db, {
    siteId,
    ownerTenantId: 'platform',
    name,
    gpuModel: 'h100',
    ...(input.policy ? { policy: input.policy } : {}),
  });
  const nodes = await registerReadyNodes(h.t.db, { siteId, poolId, count: input.nodes, namePrefix: name });
  for (const tenantId of input.tenants) {
    await offerPool(h.t.db, { poolId, tenantId, quota: { gpu: input.gpuQuota } });
  }
  return { siteId, poolId, nodes };
}
