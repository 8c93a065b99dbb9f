import { seedPool } from '../support/fleet.ts';
import { tenantMember } from '../support/iam.ts';
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
  const { identityId, token } = await tenantMember(h.iam, tenantId, options);
  return { id: tenantId, identityId, token };
}

/** A site and an H100 pool of `nodes` ready 8-GPU nodes, offered to `tenants` with `gpuQuota` each. */
export function h100Pool(
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
  return seedPool(h.t.db, {
    site: `site-${name}`,
    region: input.region ?? 'eu-central-1',
    ownerTenantId: 'platform',
    name,
    ...(input.policy ? { policy: input.policy } : {}),
    nodes: input.nodes,
    namePrefix: name,
    offers: Object.fromEntries(input.tenants.map((tenantId) => [tenantId, { gpu: input.gpuQuota }])),
  });
}
