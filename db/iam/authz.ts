import { sql, type Transaction } from 'kysely';
import type { Database, Db } from '../../core/database.ts';
import type { ResourceRef } from '../../core/iam-port.ts';

type Trx = Transaction<Database>;

/**
 * The authz projection: compute's rows describing every `compute-*` resource IAM decides on,
 * written in the same transaction as the change. `pending` stages a change (an extend's new
 * duration) that a decision reads before it applies.
 */
export async function upsertAuthzRow(
  trx: Trx,
  row: {
    type: string;
    id: string;
    tenantId: string;
    parent?: { type: string; id: string } | null;
    ownerIdentityId?: string | null;
    attributes: Record<string, unknown>;
  },
): Promise<void> {
  await trx
    .insertInto('authz_projection')
    .values({
      resource_type: row.type,
      resource_id: row.id,
      tenant_id: row.tenantId,
      parent_type: row.parent?.type ?? null,
      parent_id: row.parent?.id ?? null,
      owner_identity_id: row.ownerIdentityId ?? null,
      attributes: JSON.stringify(row.attributes),
    })
    .onConflict((oc) =>
      oc.columns(['resource_type', 'resource_id']).doUpdateSet({
        attributes: JSON.stringify(row.attributes),
        updated_at: sql<Date>`compute_now()`,
      }),
    )
    .execute();
}

/** Stages (or clears, with null) a pending change on a resource's row. */
export async function setAuthzPending(
  trx: Trx | Db,
  type: string,
  id: string,
  pending: Record<string, unknown> | null,
): Promise<void> {
  await trx
    .updateTable('authz_projection')
    .set({ pending: pending ? JSON.stringify(pending) : null, updated_at: sql<Date>`compute_now()` })
    .where('resource_type', '=', type)
    .where('resource_id', '=', id)
    .execute();
}

/** The resource as IAM sees it: the row's attributes with any pending change merged over them. */
export async function readAuthzResource(db: Trx | Db, type: string, id: string): Promise<ResourceRef | null> {
  const row = await db
    .selectFrom('authz_projection')
    .selectAll()
    .where('resource_type', '=', type)
    .where('resource_id', '=', id)
    .executeTakeFirst();
  if (!row) return null;
  return {
    type: row.resource_type,
    id: row.resource_id,
    tenantId: row.tenant_id,
    ownerIdentityId: row.owner_identity_id,
    parent: row.parent_type && row.parent_id ? { type: row.parent_type, id: row.parent_id } : null,
    attributes: { ...row.attributes, ...(row.pending ?? {}) },
  };
}
