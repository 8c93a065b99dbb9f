import { sql, type Transaction } from 'kysely';
import type { Database, Db } from '../../core/database.ts';
import { ComputeError } from '../../domain/errors.ts';
import { newId } from '../../domain/ids.ts';
import type { ProfileSpec } from '../../domain/metal-profiles.ts';

type Trx = Transaction<Database>;

export interface ProfileView {
  id: string;
  version: number;
  tenantId: string;
  name: string;
  imageId: string | null;
  spec: ProfileSpec;
  /** When a workflow first used this version; from then on it is immutable. */
  usedAt: Date | null;
  createdAt: Date;
}

function profileView(row: {
  id: string;
  version: number;
  tenant_id: string;
  name: string;
  image_id: string | null;
  spec: Record<string, unknown>;
  used_at: Date | null;
  created_at: Date;
}): ProfileView {
  return {
    id: row.id,
    version: row.version,
    tenantId: row.tenant_id,
    name: row.name,
    imageId: row.image_id,
    spec: row.spec as ProfileSpec,
    usedAt: row.used_at,
    createdAt: row.created_at,
  };
}

/**
 * Writes a new version of the profile `name` of `tenantId` (version 1, or the latest + 1 under a
 * lock of the latest row); versions are never changed afterwards, only added.
 */
export async function insertProfileVersion(
  trx: Trx,
  input: { tenantId: string; name: string; spec: ProfileSpec },
): Promise<ProfileView> {
  await sql`SELECT pg_advisory_xact_lock(hashtext(${`profile:${input.tenantId}:${input.name}`}))`.execute(
    trx,
  );
  const latest = await trx
    .selectFrom('profiles')
    .select(['id', 'version'])
    .where('tenant_id', '=', input.tenantId)
    .where('name', '=', input.name)
    .orderBy('version', 'desc')
    .executeTakeFirst();
  const row = await trx
    .insertInto('profiles')
    .values({
      id: latest?.id ?? newId('prof'),
      version: (latest?.version ?? 0) + 1,
      tenant_id: input.tenantId,
      name: input.name,
      image_id: input.spec.imageId,
      spec: JSON.stringify(input.spec),
    })
    .returningAll()
    .executeTakeFirstOrThrow();
  return profileView(row);
}

/** One version of a profile (the latest when `version` is absent), or null. */
export async function findProfile(
  db: Db | Trx,
  input: { profileId: string; version?: number | undefined },
): Promise<ProfileView | null> {
  let query = db.selectFrom('profiles').selectAll().where('id', '=', input.profileId);
  query =
    input.version === undefined
      ? query.orderBy('version', 'desc')
      : query.where('version', '=', input.version);
  const row = await query.executeTakeFirst();
  return row ? profileView(row) : null;
}

/** The profiles of `tenantId` (null: all), every version, by name and version. */
export async function listProfiles(db: Db, filter: { tenantId: string | null }): Promise<ProfileView[]> {
  let query = db.selectFrom('profiles').selectAll().orderBy('name').orderBy('version');
  if (filter.tenantId !== null) query = query.where('tenant_id', '=', filter.tenantId);
  return (await query.execute()).map(profileView);
}

/**
 * Marks a profile version used (immutable from now on), in the caller's transaction. Idempotent.
 * NOT_FOUND for a missing version.
 */
export async function markProfileUsed(trx: Trx, profileId: string, version: number): Promise<void> {
  const result = await trx
    .updateTable('profiles')
    .set({ used_at: sql<Date>`COALESCE(used_at, compute_now())` })
    .where('id', '=', profileId)
    .where('version', '=', version)
    .executeTakeFirst();
  if (Number(result.numUpdatedRows) === 0) {
    throw new ComputeError('NOT_FOUND', `profile ${profileId} has no version ${version}`);
  }
}
