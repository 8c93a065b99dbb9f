import { TtlCache } from '../../core/admission-caches.ts';
import type { IamDb } from '../../core/iam-database.ts';
import type { PolicyVersion, RoleInfo, TenantNode } from '../../core/iam-port.ts';
import { type ActiveDelegation, findActiveDelegation } from '../../db/iam/identities.ts';
import { selectActivePolicies } from '../../db/iam/policies.ts';
import { type BoundRole, listBuiltInRoles, selectBoundRoles } from '../../db/iam/roles.ts';
import { selectTenantNodes } from '../../db/iam/tenants.ts';

/**
 * The directory as decisions read it (tenants, role bindings, the newest version of each policy,
 * standing delegations, the built-in roles), cached for `ttlMs` and dropped at once by
 * `invalidate()`, which every admin write calls. Another process sees an admin change within `ttlMs`.
 */
export function createDirectory(db: IamDb, options: { ttlMs?: number } = {}) {
  const ttlMs = options.ttlMs ?? 2_000;
  const tenants = new TtlCache<Map<string, TenantNode>>(ttlMs);
  const bindings = new TtlCache<BoundRole[]>(ttlMs);
  const policies = new TtlCache<PolicyVersion[]>(ttlMs);
  const delegations = new TtlCache<ActiveDelegation | null>(ttlMs);
  const builtIn = new TtlCache<RoleInfo[]>(ttlMs);

  const tenantMap = () =>
    tenants.load('', async () => new Map((await selectTenantNodes(db)).map((t) => [t.id, t])));

  return {
    invalidate() {
      tenants.clear();
      bindings.clear();
      policies.clear();
      delegations.clear();
      builtIn.clear();
    },
    async tenant(id: string): Promise<TenantNode | undefined> {
      const map = await tenantMap();
      const hit = map.get(id);
      if (hit) return hit;
      // A tenant created by another process since the cache was filled.
      tenants.clear();
      return (await tenantMap()).get(id);
    },
    async rootTenantId(): Promise<string | null> {
      for (const t of (await tenantMap()).values()) if (t.parentId === null) return t.id;
      return null;
    },
    /** The tenant and its ancestors, nearest first. */
    async chain(id: string): Promise<TenantNode[]> {
      const out: TenantNode[] = [];
      let current = await this.tenant(id);
      while (current && out.length < 32) {
        out.push(current);
        current = current.parentId ? await this.tenant(current.parentId) : undefined;
      }
      return out;
    },
    roles(identityId: string): Promise<BoundRole[]> {
      return bindings.load(identityId, () => selectBoundRoles(db, identityId));
    },
    /** The policies in force for a tenant (the newest enabled version of each name). */
    policies(tenantId: string): Promise<PolicyVersion[]> {
      return policies.load(tenantId, () => selectActivePolicies(db, tenantId));
    },
    /** A delegation while it stands; null once it is revoked (or when it never existed). */
    delegation(delegationId: string): Promise<ActiveDelegation | null> {
      return delegations.load(delegationId, () => findActiveDelegation(db, delegationId));
    },
    /** The built-in roles (bindable on every tenant), oldest first. */
    builtInRoles(): Promise<RoleInfo[]> {
      return builtIn.load('', () => listBuiltInRoles(db));
    },
  };
}

export type Directory = ReturnType<typeof createDirectory>;
