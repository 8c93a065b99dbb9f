import type { IamDb } from '../../core/iam-database.ts';
import type { TenantInfo, TenantNode } from '../../core/iam-port.ts';
import { conflictOnDuplicate, notFoundOnMissingReference } from './iam-db.ts';

/** Every tenant of the tree, for the directory cache (iam/embedded/directory.ts). */
export async function selectTenantNodes(db: IamDb): Promise<TenantNode[]> {
  const rows = await db.selectFrom('iam.tenants').select(['id', 'name', 'parent_id']).execute();
  return rows.map((r) => ({ id: r.id, name: r.name, parentId: r.parent_id }));
}

/**
 * Inserts a tenant. CONFLICT when the id is taken (or a second root is attempted); NOT_FOUND when
 * its parent does not exist.
 */
export async function insertTenant(
  db: IamDb,
  tenant: { id: string; name: string; parentId: string | null },
): Promise<TenantInfo> {
  const row = await conflictOnDuplicate(
    () =>
      notFoundOnMissingReference(
        () =>
          db
            .insertInto('iam.tenants')
            .values({ id: tenant.id, name: tenant.name, parent_id: tenant.parentId })
            .returningAll()
            .executeTakeFirstOrThrow(),
        { parent_id: `parentId: tenant ${tenant.parentId} does not exist` },
      ),
    `tenant ${tenant.id} already exists`,
    { tenantId: tenant.id },
  );
  return { id: row.id, name: row.name, parentId: row.parent_id, createdAt: row.created_at };
}

/** Every tenant, oldest first. */
export async function listTenants(db: IamDb): Promise<TenantInfo[]> {
  const rows = await db.selectFrom('iam.tenants').selectAll().orderBy('created_at').execute();
  return rows.map((r) => ({ id: r.id, name: r.name, parentId: r.parent_id, createdAt: r.created_at }));
}
