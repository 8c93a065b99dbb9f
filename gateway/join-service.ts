import { type handleUnaryCall, Metadata, status } from '@grpc/grpc-js';
import { sql, type Transaction } from 'kysely';
import type { Database, Db } from '../core/database.ts';
import type { Logger } from '../core/logger.ts';
import { checkJoinToken, spendJoinToken } from '../db/nodes/join-tokens.ts';
import { findPeerCertificate, insertJoinedNode, revokeNodeCertificates } from '../db/nodes/nodes.ts';
import { ComputeError, errorCodeTraits, isComputeError } from '../domain/errors.ts';
import type { NodeRole } from '../domain/fleet.ts';
import { computeHardwareKey } from '../domain/hardware-key.ts';
import {
  type CaMaterial,
  type CsrContents,
  type IssuedCertificate,
  issueNodeCertificate,
  maxNodeCertificateMs,
  nodeSpiffeId,
  readCsr,
} from '../domain/pki.ts';
import type {
  JoinRequest,
  JoinResponse,
  JoinServiceServer,
  RenewRequest,
  RenewResponse,
} from '../proto/gen/agent/v1/agent.ts';
import { verifiedPeer } from './tls.ts';

export interface JoinServiceOptions {
  db: Db;
  log: Logger;
  ca: CaMaterial;
  trustDomain: string;
  /** Node certificate lifetime, at most 24 hours. */
  certificateTtlMs: number;
}

/** A ComputeError as a gRPC status, from the one table of codes; anything else is INTERNAL. */
export function toGrpcError(
  error: unknown,
  log: Logger,
): { code: number; details: string; metadata: Metadata } {
  const metadata = new Metadata();
  if (isComputeError(error)) {
    metadata.set('bc-error-code', error.code);
    return { code: errorCodeTraits[error.code].grpcStatus, details: error.message, metadata };
  }
  log.error({ err: error }, 'unexpected error');
  return { code: status.INTERNAL, details: 'internal error', metadata };
}

function sanitizeName(requested: string, hostname: string): string {
  const raw = (requested || hostname || 'node').toLowerCase();
  const name = raw
    .replace(/[^a-z0-9.-]+/g, '-')
    .replace(/^-+|-+$/g, '')
    .slice(0, 63);
  return name || 'node';
}

/**
 * Signs a node certificate for `publicKeyPem` (valid from the database's clock for the configured
 * lifetime, at most 24 hours) and records it in `node_certificates`, inside the caller's
 * transaction. Join and renewal issue every node certificate through here.
 */
export async function issueStoredNodeCertificate(
  trx: Transaction<Database>,
  options: Pick<JoinServiceOptions, 'ca' | 'certificateTtlMs'>,
  input: { nodeId: string; nodeName: string; role: NodeRole; spiffeId: string } & CsrContents,
): Promise<IssuedCertificate> {
  const { rows } = await sql<{ now: Date }>`SELECT compute_now() AS now`.execute(trx);
  const cert = await issueNodeCertificate({
    ca: options.ca,
    publicKeyPem: input.publicKeyPem,
    spiffeId: input.spiffeId,
    nodeName: input.nodeName,
    role: input.role,
    now: rows[0]!.now,
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

/**
 * Join: checks the token, computes the hardware key, creates the node or reclaims the one the key
 * names (revoking its old certificates), signs the node certificate and spends one use of the
 * token, all in one transaction.
 */
export async function joinNode(options: JoinServiceOptions, request: JoinRequest): Promise<JoinResponse> {
  if (request.token.length > 200 || request.csrPem.length > 8192 || request.requestedName.length > 253) {
    throw new ComputeError('INVALID_INPUT', 'join request fields are too long');
  }
  const csr = await readCsr(request.csrPem);
  const evidence = request.evidence;
  const hardware = computeHardwareKey({
    productUuid: evidence?.productUuid,
    serialNumber: evidence?.serialNumber,
    macs: evidence?.macs.slice(0, 64),
    gpuUuids: evidence?.gpuUuids.slice(0, 64),
  });
  return options.db.transaction().execute(async (trx) => {
    // The token is spent last: its row lock lasts only from that statement to the commit, so
    // concurrent joins with one token do not queue behind each other's certificate signing.
    const token = await checkJoinToken(trx, request.token);
    const pool = await trx
      .selectFrom('pools')
      .where('id', '=', token.poolId)
      .select(['id', 'site_id', sql<boolean>`archived_at IS NOT NULL`.as('archived')])
      .executeTakeFirstOrThrow();
    if (pool.archived) throw new ComputeError('INVALID_STATE', 'the join token names an archived pool');
    let node: { id: string; name: string; siteId: string; poolId: string } | null = null;
    let reclaimed = false;
    if (hardware.key) {
      const existing = await trx
        .selectFrom('nodes')
        .where('hardware_key', '=', hardware.key)
        .select(['id', 'name', 'site_id', 'pool_id', 'provision_state'])
        .forUpdate()
        .executeTakeFirst();
      if (existing && existing.provision_state !== 'retired') {
        await revokeNodeCertificates(trx, existing.id);
        await trx
          .updateTable('nodes')
          .set({ updated_at: sql<Date>`compute_now()` })
          .where('id', '=', existing.id)
          .execute();
        node = {
          id: existing.id,
          name: existing.name,
          siteId: existing.site_id,
          poolId: existing.pool_id ?? pool.id,
        };
        reclaimed = true;
      } else if (existing) {
        await trx.updateTable('nodes').set({ hardware_key: null }).where('id', '=', existing.id).execute();
      }
    }
    if (!node) {
      const created = await insertJoinedNode(trx, {
        siteId: pool.site_id,
        poolId: pool.id,
        name: sanitizeName(request.requestedName, evidence?.hostname ?? ''),
        hardwareKey: hardware.key,
      });
      node = { ...created, siteId: pool.site_id, poolId: pool.id };
    }
    const spiffeId = nodeSpiffeId(options.trustDomain, node.siteId, node.id);
    const cert = await issueStoredNodeCertificate(trx, options, {
      nodeId: node.id,
      nodeName: node.name,
      role: 'node',
      spiffeId,
      ...csr,
    });
    await spendJoinToken(trx, token.tokenId);
    options.log.info(
      {
        nodeId: node.id,
        nodeName: node.name,
        poolId: node.poolId,
        reclaimed,
        identifiers: hardware.identifiers,
      },
      'node joined',
    );
    return {
      nodeId: node.id,
      nodeName: node.name,
      siteId: node.siteId,
      poolId: node.poolId,
      spiffeId,
      certificatePem: cert.certificatePem,
      caCertificatePem: options.ca.certificatePem,
      notAfterMs: cert.notAfter.getTime(),
      reclaimed,
    };
  });
}

/** Renew: a node presenting its current, unrevoked certificate gets a new one for the CSR's key. */
export async function renewNodeCertificate(
  options: JoinServiceOptions,
  peer: { serial: string; spiffeId: string | null } | null,
  request: RenewRequest,
): Promise<RenewResponse> {
  if (!peer) throw new ComputeError('UNAUTHENTICATED', 'renewal needs the node certificate (mutual TLS)');
  const current = await findPeerCertificate(options.db, peer.serial);
  if (!current || current.revoked || current.expired || current.spiffeId !== peer.spiffeId) {
    throw new ComputeError('UNAUTHENTICATED', 'the certificate is unknown, revoked or expired');
  }
  if (current.provisionState === 'retired') throw new ComputeError('ACCESS_DENIED', 'the node is retired');
  const csr = await readCsr(request.csrPem);
  return options.db.transaction().execute(async (trx) => {
    const cert = await issueStoredNodeCertificate(trx, options, {
      nodeId: current.nodeId,
      nodeName: current.nodeName,
      role: current.role,
      spiffeId: current.spiffeId,
      ...csr,
    });
    options.log.info({ nodeId: current.nodeId, serial: cert.serial }, 'node certificate renewed');
    return {
      certificatePem: cert.certificatePem,
      caCertificatePem: options.ca.certificatePem,
      notAfterMs: cert.notAfter.getTime(),
    };
  });
}

/** The JoinService implementation for @grpc/grpc-js. */
export function createJoinService(options: JoinServiceOptions): JoinServiceServer {
  const join: handleUnaryCall<JoinRequest, JoinResponse> = (call, callback) => {
    joinNode(options, call.request).then(
      (response) => callback(null, response),
      (error) => {
        const peer = call.getPeer();
        if (isComputeError(error))
          options.log.warn(
            { peer, code: error.code, err: error.message, details: error.details },
            'join refused',
          );
        callback(toGrpcError(error, options.log));
      },
    );
  };
  const renew: handleUnaryCall<RenewRequest, RenewResponse> = (call, callback) => {
    renewNodeCertificate(options, verifiedPeer(call), call.request).then(
      (response) => callback(null, response),
      (error) => {
        if (isComputeError(error))
          options.log.warn({ peer: call.getPeer(), code: error.code }, 'renewal refused');
        callback(toGrpcError(error, options.log));
      },
    );
  };
  return { join, renew };
}
