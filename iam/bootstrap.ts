import type { EmbeddedIam } from './embedded/index.ts';

/**
 * Makes sure the platform exists: the root tenant, its `admin` service identity bound to the
 * built-in `admin` role (every `compute:*` action, root administration included), and a fresh API
 * token for it. Idempotent: a second run finds the tenant and identity and mints a new token
 * (tokens are stored hashed, so an old one can never be handed back).
 */
export async function bootstrapPlatform(
  iam: EmbeddedIam,
  options: { rootTenantName?: string; rootTenantId?: string; tokenName?: string } = {},
): Promise<{ rootTenantId: string; rootAdminIdentityId: string; rootAdminToken: string }> {
  let rootTenantId = await iam.admin.rootTenantId();
  if (!rootTenantId) {
    const name = options.rootTenantName ?? 'Platform';
    try {
      const tenant = await iam.admin.createTenant({
        id: options.rootTenantId ?? 'platform',
        name,
        parentId: null,
      });
      rootTenantId = tenant.id;
    } catch (error) {
      // Two processes bootstrapping at once: the other one created the root.
      iam.invalidate();
      rootTenantId = await iam.admin.rootTenantId();
      if (!rootTenantId) throw error;
    }
  }
  const identities = await iam.admin.listIdentities(rootTenantId);
  let admin = identities.find((i) => i.name === 'platform-admin');
  if (!admin) {
    try {
      admin = await iam.admin.createIdentity({
        tenantId: rootTenantId,
        kind: 'service',
        name: 'platform-admin',
      });
    } catch (error) {
      admin = (await iam.admin.listIdentities(rootTenantId)).find((i) => i.name === 'platform-admin');
      if (!admin) throw error;
    }
  }
  await iam.admin.bindRole({ identityId: admin.id, role: 'admin', tenantId: rootTenantId });
  const token = await iam.admin.createToken({ identityId: admin.id, name: options.tokenName ?? 'bootstrap' });
  return { rootTenantId, rootAdminIdentityId: admin.id, rootAdminToken: token.token };
}
