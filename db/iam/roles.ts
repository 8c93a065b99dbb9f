import { sql } from 'kysely';
import type { IamDb } from '../../core/iam-database.ts';
import type { RoleInfo } from '../../core/iam-port.ts';
import { conflictOnDuplicate, notFoundOnMissingReference } from './iam-db.ts';

/** A role bound to an identity on a tenant, as decisions read it. */
export interface BoundRole {
  roleId: string;
  roleName: string;
  tenantId: string;
  actions: string[];
}

/**
 * Inserts a tenant's role. CONFLICT when the tenant already has a role of that name; NOT_FOUND when
 * the tenant does not exist.
 */
export async function insertRole(
  db: IamDb,
  role: { id: string; tenantId: string; name: string; actions: string[] },
): Promise<void> {
  await conflictOnDuplicate(
    () =>
      notFoundOnMissingReference(
        () =>
          db
            .insertInto('iam.roles')
            .values({ id: role.id, tenant_id: role.tenantId, name: role.name, actions: role.actions })
            .execute(),
        { tenant_id: `tenantId: tenant ${role.tenantId} does not exist` },
      ),
    `tenant ${role.tenantId} already has a role named ${role.name}`,
  );
}

/** The built-in roles and the tenant's own (every role without a tenant), oldest first. */
export async function listRoles(db: IamDb, tenantId?: string): Promise<RoleInfo[]> {
  const rows = await db
    .selectFrom('iam.roles')
    .selectAll()
    .where((eb) =>
      tenantId ? eb.or([eb('tenant_id', 'is', null), eb('tenant_id', '=', tenantId)]) : eb.val(true),
    )
    .orderBy('created_at')
    .execute();
  return rows.map((r) => ({ id: r.id, tenantId: r.tenant_id, name: r.name, actions: r.actions }));
}

/** The built-in roles (no tenant: every tenant can bind them), oldest first. */
export async function listBuiltInRoles(db: IamDb): Promise<RoleInfo[]> {
  const rows = await db
    .selectFrom('iam.roles')
    .selectAll()
    .where('tenant_id', 'is', null)
    .orderBy('created_at')
    .execute();
  return rows.map((r) => ({ id: r.id, tenantId: r.tenant_id, name: r.name, actions: r.actions }));
}

/** The role `role` names for a binding on `tenantId`: by id, or by name (the tenant's own first, then a built-in). */
export async function findRoleToBind(
  db: IamDb,
  role: string,
  tenantId: string,
): Promise<{ id: string; name: string } | undefined> {
  return db
    .selectFrom('iam.roles')
    .select(['id', 'name'])
    .where((eb) =>
      eb.or([
        eb('id', '=', role),
        eb.and([eb('name', '=', role), eb.or([eb('tenant_id', '=', tenantId), eb('tenant_id', 'is', null)])]),
      ]),
    )
    .orderBy(sql`tenant_id IS NULL`)
    .executeTakeFirst();
}

/** Binds a role to an identity on a tenant; idempotent. NOT_FOUND when any of the three does not exist. */
export async function insertRoleBinding(
  db: IamDb,
  binding: { identityId: string; roleId: string; tenantId: string },
): Promise<void> {
  await notFoundOnMissingReference(
    () =>
      db
        .insertInto('iam.role_bindings')
        .values({ identity_id: binding.identityId, role_id: binding.roleId, tenant_id: binding.tenantId })
        .onConflict((oc) => oc.doNothing())
        .execute(),
    {
      identity_id: `identityId: identity ${binding.identityId} does not exist`,
      role_id: `role: role ${binding.roleId} does not exist`,
      tenant_id: `tenantId: tenant ${binding.tenantId} does not exist`,
    },
  );
}

/** Every role bound to an identity, with the tenant each binding holds on. */
export async function selectBoundRoles(db: IamDb, identityId: string): Promise<BoundRole[]> {
  const rows = await db
    .selectFrom('iam.role_bindings as b')
    .innerJoin('iam.roles as r', 'r.id', 'b.role_id')
    .where('b.identity_id', '=', identityId)
    .select(['r.id', 'r.name', 'r.actions', 'b.tenant_id'])
    .execute();
  return rows.map((r) => ({ roleId: r.id, roleName: r.name, tenantId: r.tenant_id, actions: r.actions }));
}
