import type { Db } from '../../core/database.ts';
import { ComputeError } from '../../domain/errors.ts';
import { type CaMaterial, createCertificateAuthority } from '../../domain/pki.ts';
import { isSealed, type Sealer } from '../../domain/sealing.ts';

// The control plane's one machine CA. Its certificate is public (every join-token bundle carries
// it); its private key is stored sealed ('ca-key') and read only by the gateway, the process that
// signs node certificates. An API or worker process reads the certificate alone.

const caName = 'machine';

/**
 * Creates the CA when there is none, its private key sealed before it is written; two racing
 * creators keep the first. Reads nothing back, so the caller never loads the stored key.
 */
async function createCertificateAuthorityIfMissing(
  db: Db,
  trustDomain: string,
  sealer: () => Sealer,
): Promise<void> {
  const existing = await db
    .selectFrom('certificate_authorities')
    .select('name')
    .where('name', '=', caName)
    .executeTakeFirst();
  if (existing) return;
  const ca = await createCertificateAuthority(trustDomain);
  await db
    .insertInto('certificate_authorities')
    .values({
      name: caName,
      trust_domain: trustDomain,
      certificate_pem: ca.certificatePem,
      private_key_pem: sealer().seal('ca-key', ca.privateKeyPem),
    })
    .onConflict((oc) => oc.column('name').doNothing())
    .execute();
}

/**
 * The CA certificate (public), for join-token bundles: the API's door. Never selects the private
 * key. Creates the CA first when there is none (so join tokens can be handed out before any
 * gateway ran); only then is `sealer` called, so a deployment secret is needed only to create.
 */
export async function ensureCaCertificate(
  db: Db,
  options: { trustDomain: string; sealer: () => Sealer },
): Promise<string> {
  const read = () =>
    db
      .selectFrom('certificate_authorities')
      .select('certificate_pem')
      .where('name', '=', caName)
      .executeTakeFirst();
  let row = await read();
  if (!row) {
    await createCertificateAuthorityIfMissing(db, options.trustDomain, options.sealer);
    row = await read();
  }
  if (!row) throw new ComputeError('INTERNAL', 'the machine CA could not be stored');
  return row.certificate_pem;
}

/**
 * The CA with its private key opened, for signing: the gateway's door, and the only function that
 * selects the key. Creates the CA when there is none. A key stored before sealing existed (a data
 * directory from an older version) is sealed in place in the same transaction that reads it, once;
 * a concurrent reader waits on the row lock and finds it sealed.
 *
 * Throws SealedValueError (domain/sealing.ts) when the stored key does not open with this
 * deployment secret: BETTER_COMPUTE_SECRET differs from the one it was sealed with.
 */
export async function loadSigningCertificateAuthority(
  db: Db,
  options: { trustDomain: string; sealer: Sealer },
): Promise<CaMaterial> {
  const { sealer } = options;
  await createCertificateAuthorityIfMissing(db, options.trustDomain, () => sealer);
  return db.transaction().execute(async (trx) => {
    const row = await trx
      .selectFrom('certificate_authorities')
      .select(['certificate_pem', 'private_key_pem'])
      .where('name', '=', caName)
      .forUpdate()
      .executeTakeFirst();
    if (!row) throw new ComputeError('INTERNAL', 'the machine CA could not be stored');
    if (isSealed(row.private_key_pem)) {
      return {
        certificatePem: row.certificate_pem,
        privateKeyPem: sealer.open('ca-key', row.private_key_pem),
      };
    }
    await trx
      .updateTable('certificate_authorities')
      .set({ private_key_pem: sealer.seal('ca-key', row.private_key_pem) })
      .where('name', '=', caName)
      .execute();
    return { certificatePem: row.certificate_pem, privateKeyPem: row.private_key_pem };
  });
}
