import type { Kysely } from 'kysely';
import type { PolicyDocument } from './policy.ts';
import type { IamDatabase } from './schema.ts';

export type IamDb = Kysely<IamDatabase>;

export interface TenantNode {
  id: string;
  name: string;
  parentId: string | null;
}

export interface BoundRole {
  roleId: string;
  roleName: string;
  tenantId: string;
  actions: string[];
}

export interface ActivePolicy {
  id: string;
  tenantId: string;
  name: string;
  version: number;
  document: PolicyDocument;
}

/**
 * The directory as decisions read it (tenants, role bindings, the newest version of each policy),
 * cached for `ttlMs` and dropped at once by `invalidate()`, which every admin write calls. Another
 * process sees an admin change within `ttlMs`.
 */
export function createDirectory(db: IamDb, options: { ttlMs?: number } = {}) {
  const ttlMs = options.ttlMs ?? 2_000;
  let tenants: { at: number; byId: Map<string, TenantNode> } | null = null;
  const bindings = new Map<string, { at: number; roles: BoundRole[] }>();
  const policies = new Map<string, { at: number; list: ActivePolicy[] }>();

  async function tenantMap(): Promise<Map<string, TenantNode>> {
    if (tenants && Date.now() - tenants.at < ttlMs) return tenants.byId;
    const rows = await db.selectFrom('iam.tenants').select(['id', 'name', 'parent_id']).execute();
    const byId = new Map(rows.map((r) => [r.id, { id: r.id, name: r.name, parentId: r.parent_id }]));
    tenants = { at: Date.now(), byId };
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
      if (hit && Date.now() - hit.at < ttlMs) return hit.roles;
      const rows = await db
        .selectFrom('iam.role_bindings as b')
        .innerJoin('iam.roles as r', 'r.id', 'b.role_id')
        .where('b.identity_id', '=', identityId)
        .select(['r.id', 'r.name', 'r.actions', 'b.tenant_id'])
        .execute();
      const roles = rows.map((r) => ({
        roleId: r.id,
        roleName: r.name,
        tenantId: r.tenant_id,
        actions: r.actions,
      }));
      bindings.set(identityId, { at: Date.now(), roles });
      return roles;
    },
    async policies(tenantId: string): Promise<ActivePolicy[]> {
      const hit = policies.get(tenantId);
      if (hit && Date.now() - hit.at < ttlMs) return hit.list;
      const rows = await db
        .selectFrom('iam.policies')
        .where('tenant_id', '=', tenantId)
        .distinctOn('name')
        .orderBy('name')
        .orderBy('version', 'desc')
        .select(['id', 'tenant_id', 'name', 'version', 'document', 'disabled'])
        .execute();
      const list = rows
        .filter((r) => !r.disabled)
        .map((r) => ({
          id: r.id,
          tenantId: r.tenant_id,
          name: r.name,
          version: r.version,
          document: r.document as PolicyDocument,
        }));
      policies.set(tenantId, { at: Date.now(), list });
      return list;
    },
  };
}

export type Directory = ReturnType<typeof createDirectory>;
