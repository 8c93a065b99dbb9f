import { type Selectable, sql, type Transaction } from 'kysely';
import type { Database, Db, ReleasesTable } from '../../core/database.ts';
import { ComputeError } from '../../domain/errors.ts';
import { newId } from '../../domain/ids.ts';
import {
  checkNotDowngrade,
  checkReleaseFiles,
  checkReleaseNotExpired,
  manifestDigest,
  type ReleaseManifest,
  type ReleaseSignature,
  releaseManifestSchema,
  releaseSignatureSchema,
} from '../../domain/release-manifest.ts';
import { compareVersions } from '../../domain/release-version.ts';
import { insertOutboxEvent } from '../events/outbox.ts';

type Trx = Transaction<Database>;

export interface ReleaseView {
  id: string;
  channel: string;
  version: string;
  protocolVersion: number;
  minControlPlaneVersion: string;
  manifest: ReleaseManifest;
  manifestDigest: string;
  signatures: ReleaseSignature[];
  signerPins: string[];
  expiresAt: Date;
  publishedBy: string | null;
  createdAt: Date;
}

function releaseView(row: Selectable<ReleasesTable>): ReleaseView {
  return {
    id: row.id,
    channel: row.channel,
    version: row.version,
    protocolVersion: row.protocol_version,
    minControlPlaneVersion: row.min_control_plane_version,
    manifest: releaseManifestSchema.parse(row.manifest),
    manifestDigest: row.manifest_digest,
    signatures: releaseSignatureSchema.array().parse(row.signatures),
    signerPins: row.signer_pins,
    expiresAt: row.expires_at,
    publishedBy: row.published_by,
    createdAt: row.created_at,
  };
}

/**
 * Stores a release whose signatures the caller verified (`signerPins`: the pins that counted) with
 * its files, in one transaction: checks the files' bytes against the manifest (`digest-mismatch`),
 * the expiry against the database clock (`expired`) and, under a per-channel advisory lock, that
 * the version is above every version the channel published (`downgrade`, CONFLICT). Publishing the
 * very same manifest again answers the stored release (idempotent).
 */
export async function insertRelease(
  db: Db,
  input: {
    manifest: ReleaseManifest;
    signatures: ReleaseSignature[];
    signerPins: string[];
    files: ReadonlyMap<string, Buffer>;
    publishedBy: string | null;
  },
): Promise<{ release: ReleaseView; created: boolean }> {
  const { manifest } = input;
  checkReleaseFiles(manifest, input.files);
  const digest = manifestDigest(manifest);
  return db.transaction().execute(async (trx) => {
    await sql`SELECT pg_advisory_xact_lock(hashtext(${`release-channel:${manifest.channel}`}))`.execute(trx);
    const same = await trx
      .selectFrom('releases')
      .selectAll()
      .where('manifest_digest', '=', digest)
      .executeTakeFirst();
    if (same) return { release: releaseView(same), created: false };
    const { rows } = await sql<{ now: Date }>`SELECT compute_now() AS now`.execute(trx);
    checkReleaseNotExpired(manifest, rows[0]!.now.getTime());
    checkNotDowngrade(manifest, await newestVersion(trx, manifest.channel), 'the newest published');
    const id = newId('rel');
    const row = await trx
      .insertInto('releases')
      .values({
        id,
        channel: manifest.channel,
        version: manifest.version,
        protocol_version: manifest.protocolVersion,
        min_control_plane_version: manifest.minControlPlaneVersion,
        manifest: JSON.stringify(manifest),
        manifest_digest: digest,
        signatures: JSON.stringify(input.signatures),
        signer_pins: input.signerPins,
        expires_at: manifest.expiresAt,
        published_by: input.publishedBy,
      })
      .returningAll()
      .executeTakeFirstOrThrow();
    await insertOutboxEvent(trx, {
      type: 'release.published',
      subject: `release/${id}`,
      tenantId: null,
      data: {
        releaseId: id,
        channel: manifest.channel,
        version: manifest.version,
        signerPins: input.signerPins,
      },
    });
    for (const f of manifest.files) {
      await trx
        .insertInto('release_files')
        .values({
          release_id: id,
          path: f.path,
          size: f.size,
          sha256: f.sha256,
          content: input.files.get(f.path)!,
        })
        .execute();
    }
    return { release: releaseView(row), created: true };
  });
}

/** The highest version published on a channel, or null. */
async function newestVersion(trx: Trx, channel: string): Promise<string | null> {
  const versions = await trx
    .selectFrom('releases')
    .select('version')
    .where('channel', '=', channel)
    .execute();
  return (
    versions
      .map((v) => v.version)
      .sort(compareVersions)
      .at(-1) ?? null
  );
}

export async function findRelease(db: Db | Trx, id: string): Promise<ReleaseView | null> {
  const row = await db.selectFrom('releases').selectAll().where('id', '=', id).executeTakeFirst();
  return row ? releaseView(row) : null;
}

/** NOT_FOUND unless the release exists. */
export async function requireRelease(db: Db | Trx, id: string): Promise<ReleaseView> {
  const release = await findRelease(db, id);
  if (!release) throw new ComputeError('NOT_FOUND', `release ${id} not found (releases.list shows them)`);
  return release;
}

/** Releases newest first, optionally of one channel. */
export async function listReleases(
  db: Db,
  input: { channel?: string; limit: number },
): Promise<ReleaseView[]> {
  let query = db.selectFrom('releases').selectAll().orderBy('created_at', 'desc').orderBy('id', 'desc');
  if (input.channel) query = query.where('channel', '=', input.channel);
  return (await query.limit(input.limit).execute()).map(releaseView);
}

/** A release's files with their bytes, in manifest order (what bcd.update carries). */
export async function findReleaseFiles(
  db: Db | Trx,
  releaseId: string,
): Promise<Array<{ path: string; content: Buffer }>> {
  const rows = await db
    .selectFrom('release_files')
    .select(['path', 'content'])
    .where('release_id', '=', releaseId)
    .orderBy('path')
    .execute();
  return rows;
}
