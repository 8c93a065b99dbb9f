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
  let tenants: { at: number; byId: Map<string, TenantNode> } | null = null;
  const bindings = new Map<string, { at: number; roles: BoundRole[] }>();
  const policies = new Map<string, { at: number; list: PolicyVersion[] }>();
  const delegations = new Map<string, { at: number; row: ActiveDelegation | null }>();
  let builtIn: { at: number; roles: RoleInfo[] } | null = null;

  async function tenantMap(): Promise<Map<string, TenantNode>> {
    if (tenants && Date.now() - tenants.at < ttlMs) return tenants.byId; // wall time: the cache's TTL
    const byId = new Map((await selectTenantNodes(db)).map((t) => [t.id, t]));
    tenants = { at: Date.now(), byId }; // wall time: the cache's TTL
    return byId;
  }

  return {
    invalidate() {
      tenants = null;
      bindings.clear();
      policies.clear();
      delegations.clear();
      builtIn = null;
    },
    async tenant(id: string): Promise<TenantNode | undefined> {
      const map = await tenantMap();
      const hit = map.get(id);
      if (hit) return hit;
      // A tenant created by another process since the cache was filled.
      tenants = null;
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
    async roles(identityId: string): Promise<BoundRole[]> {
      const hit = bindings.get(identityId);
      if (hit && Date.now() - hit.at < ttlMs) return hit.roles; // wall time: the cache's TTL
      const roles = await selectBoundRoles(db, identityId);
      bindings.set(identityId, { at: Date.now(), roles }); // wall time: the cache's TTL
      return roles;
    },
    /** The policies in force for a tenant (the newest enabled version of each name). */
    async policies(tenantId: string): Promise<PolicyVersion[]> {
      const hit = policies.get(tenantId);
      if (hit && Date.now() - hit.at < ttlMs) return hit.list; // wall time: the cache's TTL
      const list = await selectActivePolicies(db, tenantId);
      policies.set(tenantId, { at: Date.now(), list }); // wall time: the cache's TTL
      return list;
    },
    /** A delegation while it stands; null once it is revoked (or when it never existed). */
    async delegation(delegationId: string): Promise<ActiveDelegation | null> {
      const hit = delegations.get(delegationId);
      if (hit && Date.now() - hit.at < ttlMs) return hit.row; // wall time: the cache's TTL
      const row = await findActiveDelegation(db, delegationId);
      delegations.set(delegationId, { at: Date.now(), row }); // wall time: the cache's TTL
      return row;
    },
    /** The built-in roles (bindable on every tenant), oldest first. */
    async builtInRoles(): Promise<RoleInfo[]> {
      if (builtIn && Date.now() - builtIn.at < ttlMs) return builtIn.roles; // wall time: the cache's TTL
      const roles = await listBuiltInRoles(db);
      builtIn = { at: Date.now(), roles }; // wall time: the cache's TTL
      return roles;
    },
  };
}

export type Directory = ReturnType<typeof createDirectory>;
