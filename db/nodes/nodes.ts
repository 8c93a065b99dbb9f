import { sql, type Transaction } from 'kysely';
import type { Database, Db } from '../../core/database.ts';
import type { AttestationCertificate } from '../../domain/attestation.ts';
import { ComputeError } from '../../domain/errors.ts';
import type { NodeRole } from '../../domain/fleet.ts';
import { newId } from '../../domain/ids.ts';
import { canonicalJson, type DeviceAssignment, normalizeAssignments } from '../../domain/node-spec.ts';
import { type CaMaterial, createCertificateAuthority } from '../../domain/pki.ts';

type Trx = Transaction<Database>;

const caName = 'machine';

/** The control plane's CA, created on first use (two racing creators keep the first). */
export async function ensureCertificateAuthority(db: Db, trustDomain: string): Promise<CaMaterial> {
  const read = () =>
    db
      .selectFrom('certificate_authorities')
      .select(['certificate_pem', 'private_key_pem', 'trust_domain'])
      .where('name', '=', caName)
      .executeTakeFirst();
  let row = await read();
  if (!row) {
    const ca = await createCertificateAuthority(trustDomain);
    await db
      .insertInto('certificate_authorities')
      .values({
        name: caName,
        trust_domain: trustDomain,
        certificate_pem: ca.certificatePem,
        private_key_pem: ca.privateKeyPem,
      })
      .onConflict((oc) => oc.column('name').doNothing())
      .execute();
    row = await read();
  }
  if (!row) throw new ComputeError('INTERNAL', 'the machine CA could not be stored');
  return { certificatePem: row.certificate_pem, privateKeyPem: row.private_key_pem };
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
  const row = await db
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
    ])
    .executeTakeFirst();
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

/** Revokes every certificate of a node (a reclaimed or retired machine). */
export async function revokeNodeCertificates(trx: Trx | Db, nodeId: string): Promise<number> {
  const result = await trx
    .updateTable('node_certificates')
    .set({ revoked_at: sql<Date>`compute_now()` })
    .where('node_id', '=', nodeId)
    .where('revoked_at', 'is', null)
    .executeTakeFirst();
  return Number(result.numUpdatedRows);
}

/**
 * The certificates whose key id is `keyId`, for verifying an attested report
 * (`verifyAttestedReport` in domain/attestation.ts).
 */
export async function findAttestationCertificates(
  db: Db | Trx,
  keyId: string,
): Promise<AttestationCertificate[]> {
  const rows = await db
    .selectFrom('node_certificates')
    .select(['node_id', 'role', 'key_id', 'public_key_pem', 'not_after', 'revoked_at'])
    .where('key_id', '=', keyId)
    .execute();
  return rows.map((r) => ({
    nodeId: r.node_id,
    role: r.role,
    keyId: r.key_id,
    publicKeyPem: r.public_key_pem,
    notAfter: r.not_after,
    revokedAt: r.revoked_at,
  }));
}

/**
 * Rewrites the `devices` section of a node's NodeSpec to exactly `assignments`, under the node's
 * row lock, bumping `spec_generation` only when the canonical JSON changes (idempotent). Answers
 * the generation and whether it changed. NOT_FOUND for an unknown node.
 */
export async function setNodeDevicesAssignment(
  trx: Trx,
  nodeId: string,
  assignments: readonly DeviceAssignment[],
): Promise<{ generation: number; changed: boolean }> {
  const node = await trx
    .selectFrom('nodes')
    .where('id', '=', nodeId)
    .select(['spec', 'spec_generation'])
    .forUpdate()
    .executeTakeFirst();
  if (!node) throw new ComputeError('NOT_FOUND', `node ${nodeId} does not exist`);
  const spec = { ...((node.spec ?? {}) as Record<string, unknown>) };
  const next = { ...spec, devices: normalizeAssignments(assignments) };
  if (canonicalJson(next) === canonicalJson(spec)) {
    return { generation: Number(node.spec_generation), changed: false };
  }
  const row = await trx
    .updateTable('nodes')
    .set({
      spec: canonicalJson(next),
      spec_generation: sql<string>`spec_generation + 1`,
      updated_at: sql<Date>`compute_now()`,
    })
    .where('id', '=', nodeId)
    .returning('spec_generation')
    .executeTakeFirstOrThrow();
  return { generation: Number(row.spec_generation), changed: true };
}

/** Sets or clears a node condition (idempotent; `since` is kept while the reason stays). */
export async function setNodeCondition(
  db: Db | Trx,
  nodeId: string,
  condition: { type: string; reason: string; message: string; effect: 'NoSchedule' | null } | null,
  type?: string,
): Promise<void> {
  if (!condition) {
    await db
      .deleteFrom('node_conditions')
      .where('node_id', '=', nodeId)
      .where('type', '=', type ?? '')
      .execute();
    return;
  }
  await sql`
    INSERT INTO node_conditions (node_id, type, reason, message, effect)
    VALUES (${nodeId}, ${condition.type}, ${condition.reason}, ${condition.message}, ${condition.effect})
    ON CONFLICT (node_id, type) DO UPDATE SET
      reason = EXCLUDED.reason, message = EXCLUDED.message, effect = EXCLUDED.effect,
      since = CASE WHEN node_conditions.reason = EXCLUDED.reason THEN node_conditions.since ELSE compute_now() END,
      updated_at = compute_now()`.execute(db);
}

/** Creates a node in a pool (JoinService) with generation 1 of an empty NodeSpec. */
export async function insertJoinedNode(
  trx: Trx,
  input: { siteId: string; poolId: string; name: string; hardwareKey: string | null; role?: NodeRole },
): Promise<{ id: string; name: string }> {
  const id = newId('node');
  const base = input.name;
  for (let attempt = 0; attempt < 5; attempt++) {
    const name = attempt === 0 ? base : `${base}-${id.slice(-4 - attempt)}`;
    const inserted = await trx
      .insertInto('nodes')
      .values({
        id,
        site_id: input.siteId,
        pool_id: input.poolId,
        name,
        role: input.role ?? 'node',
        provision_state: 'enrolling',
        hardware_key: input.hardwareKey,
        spec: canonicalJson({ devices: [] }),
        spec_generation: 1,
      })
      .onConflict((oc) => oc.columns(['site_id', 'name']).doNothing())
      .returning('name')
      .executeTakeFirst();
    if (inserted) return { id, name: inserted.name };
  }
  throw new ComputeError('CONFLICT', `no free node name near ${base} in the site`);
}
