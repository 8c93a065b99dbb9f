import type { IamDb } from '../../core/iam-database.ts';
import type { PolicyVersion, TenantNode } from '../../core/iam-port.ts';
import { selectActivePolicies } from '../../db/iam/policies.ts';
import { type BoundRole, selectBoundRoles } from '../../db/iam/roles.ts';
import { selectTenantNodes } from '../../db/iam/tenants.ts';

/**
 * The directory as decisions read it (tenants, role bindings, the newest version of each policy),
 * cached for `ttlMs` and dropped at once by `invalidate()`, which every admin write calls. Another
 * process sees an admin change within `ttlMs`.
 */
export function createDirectory(db: IamDb, options: { ttlMs?: number } = {}) {
  const ttlMs = options.ttlMs ?? 2_000;
  let tenants: { at: number; byId: Map<string, TenantNode> } | null = null;
  const bindings = new Map<string, { at: number; roles: BoundRole[] }>();
  const policies = new Map<string, { at: number; list: PolicyVersion[] }>();

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
  };
}

export type Directory = ReturnType<typeof createDirectory>;
