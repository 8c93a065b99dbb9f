import type { Transaction } from 'kysely';
import type { Database, Db } from '../../core/database.ts';
import { ComputeError } from '../../domain/errors.ts';
import { newId } from '../../domain/ids.ts';
import type { ImageFormat } from '../../domain/metal-images.ts';

type Trx = Transaction<Database>;

export interface ImageView {
  id: string;
  tenantId: string;
  name: string;
  version: string;
  format: ImageFormat;
  sha256: string;
  url: string;
  sizeBytes: number | null;
  signed: boolean;
  signerPin: string | null;
  verified: boolean;
  /** `public` (verified: every tenant may deploy it) or `private` (its tenant only). */
  visibility: 'public' | 'private';
  createdAt: Date;
}

function imageView(row: {
  id: string;
  tenant_id: string;
  name: string;
  version: string;
  format: ImageFormat;
  sha256: string;
  url: string;
  size_bytes: string | null;
  signature: string | null;
  signer_pin: string | null;
  verified: boolean;
  created_at: Date;
}): ImageView {
  return {
    id: row.id,
    tenantId: row.tenant_id,
    name: row.name,
    version: row.version,
    format: row.format,
    sha256: row.sha256,
    url: row.url,
    sizeBytes: row.size_bytes === null ? null : Number(row.size_bytes),
    signed: row.signature !== null,
    signerPin: row.signer_pin,
    verified: row.verified,
    visibility: row.verified ? 'public' : 'private',
    createdAt: row.created_at,
  };
}

/**
 * Registers an image of `tenantId`. Idempotent for the same name, version and digest (answers the
 * stored image); CONFLICT when that name@version already names other bytes (images are immutable).
 */
export async function insertImage(
  trx: Trx,
  input: {
    tenantId: string;
    name: string;
    version: string;
    format: ImageFormat;
    sha256: string;
    url: string;
    sizeBytes: number | null;
    signature: string | null;
    signerPin: string | null;
    verified: boolean;
  },
): Promise<{ image: ImageView; created: boolean }> {
  const existing = await trx
    .selectFrom('images')
    .selectAll()
    .where('tenant_id', '=', input.tenantId)
    .where('name', '=', input.name)
    .where('version', '=', input.version)
    .forUpdate()
    .executeTakeFirst();
  if (existing) {
    if (existing.sha256 !== input.sha256 || existing.format !== input.format) {
      throw new ComputeError(
        'CONFLICT',
        `${input.name}@${input.version} is already registered with sha256 ${existing.sha256} (${existing.format}): images are immutable, register a new version`,
        { imageId: existing.id },
      );
    }
    return { image: imageView(existing), created: false };
  }
  const row = await trx
    .insertInto('images')
    .values({
      id: newId('img'),
      tenant_id: input.tenantId,
      name: input.name,
      version: input.version,
      format: input.format,
      sha256: input.sha256,
      url: input.url,
      size_bytes: input.sizeBytes,
      signature: input.signature,
      signer_pin: input.signerPin,
      verified: input.verified,
    })
    .returningAll()
    .executeTakeFirstOrThrow();
  return { image: imageView(row), created: true };
}

/** One image, or null. */
export async function findImage(db: Db | Trx, imageId: string): Promise<ImageView | null> {
  const row = await db.selectFrom('images').selectAll().where('id', '=', imageId).executeTakeFirst();
  return row ? imageView(row) : null;
}

/**
 * The images `tenantId` may deploy: its own and every verified one (`tenantId` null: all, for the
 * platform's administrators), by name and version.
 */
export async function listImages(db: Db, filter: { tenantId: string | null }): Promise<ImageView[]> {
  let query = db.selectFrom('images').selectAll().orderBy('name').orderBy('created_at');
  if (filter.tenantId !== null) {
    const tenantId = filter.tenantId;
    query = query.where((eb) => eb.or([eb('tenant_id', '=', tenantId), eb('verified', '=', true)]));
  }
  return (await query.execute()).map(imageView);
}

/** Whether `tenantId` may see and deploy `image`: its own, or a verified one. */
export function imageUsableBy(image: ImageView, tenantId: string): boolean {
  return image.verified || image.tenantId === tenantId;
}
