import type { EmbeddedIam } from '../../iam/embedded/index.ts';

/** A tenant's identity and a bearer token for it. */
export interface TenantMember {
  tenantId: string;
  identityId: string;
  token: string;
}

/**
 * An identity of `tenantId` bound to `role` (default member) and a token for it; the tenant is
 * created first unless it exists. The identity is named `<tenant>-user` unless `name` says otherwise.
 */
export async function tenantMember(
  iam: EmbeddedIam,
  tenantId: string,
  options: { role?: string; name?: string; kind?: 'person' | 'service' } = {},
): Promise<TenantMember> {
  if (!(await iam.admin.getTenant(tenantId))) await iam.admin.createTenant({ id: tenantId, name: tenantId });
  const identity = await iam.admin.createIdentity({
    tenantId,
    kind: options.kind ?? 'person',
    name: options.name ?? `${tenantId}-user`,
  });
  await iam.admin.bindRole({ identityId: identity.id, role: options.role ?? 'member' });
  const { token } = await iam.admin.createToken({ identityId: identity.id });
  return { tenantId, identityId: identity.id, token };
}

/** "At most 8 H100s for at most 72 hours in these regions" as one deny statement. */
export const boundedH100Policy = {
  statements: [
    {
      sid: 'BoundedH100',
      effect: 'deny',
      actions: ['compute:reservations:create', 'compute:reservations:extend'],
      condition: {
        all: [
          { attribute: 'gpuModel', operator: 'equals', value: 'h100' },
          {
            not: {
              all: [
                { attribute: 'gpuCount', operator: 'lessThanOrEqual', value: 8 },
                { attribute: 'durationHours', operator: 'lessThanOrEqual', value: 72 },
                { attribute: 'region', operator: 'in', value: ['eu-central-1', 'eu-west-1'] },
              ],
            },
          },
        ],
      },
    },
  ],
};
