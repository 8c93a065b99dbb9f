import type { IamDb } from '../../core/iam-database.ts';
import { notFoundOnMissingReference } from './iam-db.ts';

/** Whether a feature is set on this very tenant: true or false, or undefined when it is not set here. */
export async function findFeatureFlag(
  db: IamDb,
  tenantId: string,
  feature: string,
): Promise<boolean | undefined> {
  const row = await db
    .selectFrom('iam.feature_flags')
    .select('enabled')
    .where('tenant_id', '=', tenantId)
    .where('feature', '=', feature)
    .executeTakeFirst();
  return row?.enabled;
}

/**
 * Sets a feature on a tenant (its descendants inherit it unless they set it themselves). NOT_FOUND
 * when the tenant does not exist.
 */
export async function upsertFeatureFlag(
  db: IamDb,
  flag: { tenantId: string; feature: string; enabled: boolean },
): Promise<void> {
  await notFoundOnMissingReference(
    () =>
      db
        .insertInto('iam.feature_flags')
        .values({ tenant_id: flag.tenantId, feature: flag.feature, enabled: flag.enabled })
        .onConflict((oc) => oc.columns(['tenant_id', 'feature']).doUpdateSet({ enabled: flag.enabled }))
        .execute(),
    { tenant_id: `tenantId: tenant ${flag.tenantId} does not exist` },
  );
}
