import { sql, type Transaction } from 'kysely';
import type { CertificateRevokeReason, Database, Db } from '../../core/database.ts';
import type { AttestationCertificate } from '../../domain/attestation.ts';
import type { NodeRole } from '../../domain/fleet.ts';
import {
  type CaMaterial,
  type CsrContents,
  type IssuedCertificate,
  issueNodeCertificate,
  maxNodeCertificateMs,
} from '../../domain/pki.ts';
import { readComputeNow } from '../clock.ts';
import { executePrepared } from '../pool.ts';

type Trx = Transaction<Database>;

// The CA itself (its certificate, and its sealed private key) is stored by certificate-authority.ts.

/**
 * Signs a node certificate for `publicKeyPem` (valid from the database's clock for `certificateTtlMs`,
 * at most 24 hours) and records it in `node_certificates`, inside the caller's transaction. Join,
 * renewal and the benchmark's direct provisioning issue every node certificate through here.
 */
export async function issueStoredNodeCertificate(
  trx: Trx,
  options: { ca: CaMaterial; certificateTtlMs: number },
  input: { nodeId: string; nodeName: string; role: NodeRole; spiffeId: string } & CsrContents,
  /** `compute_now()` when the caller already read it in this transaction (one round trip fewer). */
  now?: Date,
): Promise<IssuedCertificate> {
  const cert = await issueNodeCertificate({
    ca: options.ca,
    publicKeyPem: input.publicKeyPem,
    spiffeId: input.spiffeId,
    nodeName: input.nodeName,
    role: input.role,
    now: now ?? (await readComputeNow(trx)),
    validForMs: Math.min(options.certificateTtlMs, maxNodeCertificateMs),
  });
  await trx
    .insertInto('node_certificates')
    .values({
      serial: cert.serial,
      node_id: input.nodeId,
      role: input.role,
      spiffe_id: input.spiffeId,
      key_id: input.keyId,
      public_key_pem: input.publicKeyPem,
      certificate_pem: cert.certificatePem,
      not_before: cert.notBefore,
      not_after: cert.notAfter,
    })
    .execute();
  return cert;
}

/** A node's certificate with what the gateway checks on every session. */
export interface PeerCertificateRow {
  serial: string;
  nodeId: string;
  role: NodeRole;
  spiffeId: string;
  revoked: boolean;
  expired: boolean;
  nodeName: string;
  siteId: string;
  provisionState: string;
}

export async function findPeerCertificate(db: Db, serial: string): Promise<PeerCertificateRow | null> {
  const [row] = await executePrepared(
    db,
    db
      .selectFrom('node_certificates as c')
      .innerJoin('nodes as n', 'n.id', 'c.node_id')
      .where('c.serial', '=', serial)
      .select([
        'c.serial',
        'c.node_id',
        'c.role',
        'c.spiffe_id',
        sql<boolean>`c.revoked_at IS NOT NULL`.as('revoked'),
        sql<boolean>`c.not_after <= compute_now()`.as('expired'),
        'n.name',
        'n.site_id',
        'n.provision_state',
      ]),
  );
  if (!row) return null;
  return {
    serial: row.serial,
    nodeId: row.node_id,
    role: row.role,
    spiffeId: row.spiffe_id,
    revoked: row.revoked,
    expired: row.expired,
    nodeName: row.name,
    siteId: row.site_id,
    provisionState: row.provision_state,
  };
}

/** Of `serials`, those whose certificate is revoked or expired now (a live session must end). */
export async function findInvalidCertificateSerials(db: Db, serials: readonly string[]): Promise<string[]> {
  if (serials.length === 0) return [];
  const { rows } = await sql<{ serial: string }>`
    SELECT serial FROM node_certificates
    WHERE serial = ANY(${serials}::text[])
      AND (revoked_at IS NOT NULL OR not_after <= compute_now())`.execute(db);
  return rows.map((r) => r.serial);
}

/**
 * Revokes every unrevoked certificate of a node, but `exceptSerial`, with `reason` (null: for
 * cause). Idempotent: revoked ones keep their time and reason. Answers how many it revoked.
 */
export async function revokeNodeCertificates(
  trx: Trx | Db,
  nodeId: string,
  options: { reason?: CertificateRevokeReason | null; exceptSerial?: string } = {},
): Promise<number> {
  let query = trx
    .updateTable('node_certificates')
    .set({ revoked_at: sql<Date>`compute_now()`, revoke_reason: options.reason ?? null })
    .where('node_id', '=', nodeId)
    .where('revoked_at', 'is', null);
  if (options.exceptSerial) query = query.where('serial', '!=', options.exceptSerial);
  const result = await query.executeTakeFirst();
  return Number(result.numUpdatedRows);
}

/**
 * Locks a certificate's row for a renewal, in the caller's transaction: answers whether it is
 * still unrevoked (two renewals with one certificate: the second finds it superseded).
 */
export async function lockUnrevokedCertificate(trx: Trx, serial: string): Promise<boolean> {
  const row = await trx
    .selectFrom('node_certificates')
    .select('serial')
    .where('serial', '=', serial)
    .where('revoked_at', 'is', null)
    .forUpdate()
    .executeTakeFirst();
  return row !== undefined;
}

/**
 * The public keys that may sign a reclaim proof for `nodeId` with key id `keyId`: those of its
 * unrevoked certificates, expired ones included (a machine may have been off for days). Read-only.
 */
export async function findReclaimPublicKeys(db: Db | Trx, nodeId: string, keyId: string): Promise<string[]> {
  const rows = await db
    .selectFrom('node_certificates')
    .select('public_key_pem')
    .distinct()
    .where('node_id', '=', nodeId)
    .where('key_id', '=', keyId)
    .where('revoked_at', 'is', null)
    .limit(4)
    .execute();
  return rows.map((r) => r.public_key_pem);
}

/**
 * The certificates whose key id is `keyId`, for verifying an attested report
 * (`verifyAttestedReport` in domain/attestation.ts). A superseded certificate (renewed, or
 * replaced by a proved reclaim) is not revoked for cause: it counts as expiring when it was
 * superseded, so what its key signed before stays valid within the offline grace.
 */
export async function findAttestationCertificates(
  db: Db | Trx,
  keyId: string,
): Promise<AttestationCertificate[]> {
  const rows = await db
    .selectFrom('node_certificates')
    .select(['node_id', 'role', 'key_id', 'public_key_pem', 'not_after', 'revoked_at', 'revoke_reason'])
    .where('key_id', '=', keyId)
    .execute();
  return rows.map((r) => {
    const superseded = r.revoke_reason === 'superseded' && r.revoked_at !== null;
    return {
      nodeId: r.node_id,
      role: r.role,
      keyId: r.key_id,
      publicKeyPem: r.public_key_pem,
      notAfter: superseded && r.revoked_at! < r.not_after ? r.revoked_at! : r.not_after,
      revokedAt: superseded ? null : r.revoked_at,
    };
  });
}

/** The latest expiry of each node's unrevoked certificates, by node id. */
export async function latestCertificateExpiries(
  db: Db,
  nodeIds: readonly string[],
): Promise<Map<string, Date>> {
  if (nodeIds.length === 0) return new Map();
  const rows = await db
    .selectFrom('node_certificates')
    .select(['node_id', sql<Date>`max(not_after)`.as('not_after')])
    .where('node_id', 'in', nodeIds)
    .where('revoked_at', 'is', null)
    .groupBy('node_id')
    .execute();
  return new Map(rows.map((r) => [r.node_id, r.not_after]));
}
