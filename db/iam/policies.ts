import { sql } from 'kysely';
import type { IamDb } from '../../core/iam-database.ts';
import { type PolicyDocument, policyDocumentSchema } from '../../core/iam-policy.ts';
import type { PolicyVersion } from '../../core/iam-port.ts';
import { notFoundOnMissingReference } from './iam-db.ts';

/** A stored policy document, parsed by its schema (it was validated when it was applied). */
function storedDocument(document: unknown): PolicyDocument {
  return policyDocumentSchema.parse(document);
}

/**
 * Inserts the next version of the tenant's policy `name` (1 for a new name): in force from now on.
 * The document must already be valid. NOT_FOUND when the tenant does not exist.
 */
export async function insertPolicyVersion(
  db: IamDb,
  policy: { id: string; tenantId: string; name: string; document: PolicyDocument; createdBy: string | null },
): Promise<PolicyVersion> {
  const insert = db
    .insertInto('iam.policies')
    .values({
      id: policy.id,
      tenant_id: policy.tenantId,
      name: policy.name,
      version: sql<number>`(SELECT COALESCE(max(version), 0) + 1 FROM iam.policies
                            WHERE tenant_id = ${policy.tenantId} AND name = ${policy.name})`,
      document: JSON.stringify(policy.document),
      created_by: policy.createdBy,
    })
    .returning(['id', 'version']);
  const row = await notFoundOnMissingReference(() => insert.executeTakeFirstOrThrow(), {
    tenant_id: `tenantId: tenant ${policy.tenantId} does not exist`,
  });
  return {
    id: row.id,
    tenantId: policy.tenantId,
    name: policy.name,
    version: row.version,
    document: policy.document,
  };
}

/** Every version of the tenant's policies, by name, newest version first. */
export async function listPolicyVersions(
  db: IamDb,
  tenantId: string,
): Promise<Array<PolicyVersion & { createdAt: Date }>> {
  const rows = await db
    .selectFrom('iam.policies')
    .selectAll()
    .where('tenant_id', '=', tenantId)
    .orderBy('name')
    .orderBy('version', 'desc')
    .execute();
  return rows.map((r) => ({
    id: r.id,
    tenantId: r.tenant_id,
    name: r.name,
    version: r.version,
    document: storedDocument(r.document),
    createdAt: r.created_at,
  }));
}

/** The policies in force for a tenant: the newest version of each name, unless that version is disabled. */
export async function selectActivePolicies(db: IamDb, tenantId: string): Promise<PolicyVersion[]> {
  const rows = await db
    .selectFrom('iam.policies')
    .where('tenant_id', '=', tenantId)
    .distinctOn('name')
    .orderBy('name')
    .orderBy('version', 'desc')
    .select(['id', 'tenant_id', 'name', 'version', 'document', 'disabled'])
    .execute();
  return rows
    .filter((r) => !r.disabled)
    .map((r) => ({
      id: r.id,
      tenantId: r.tenant_id,
      name: r.name,
      version: r.version,
      document: storedDocument(r.document),
    }));
}
