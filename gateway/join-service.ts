import { type handleUnaryCall, Metadata, status } from '@grpc/grpc-js';
import type { Db } from '../core/database.ts';
import type { Logger } from '../core/logger.ts';
import { findPeerCertificate, issueStoredNodeCertificate } from '../db/nodes/certificates.ts';
import { findPool } from '../db/nodes/fleet.ts';
import { checkJoinToken, spendJoinToken } from '../db/nodes/join-tokens.ts';
import { insertJoinedNode, reclaimNodeByHardwareKey } from '../db/nodes/nodes.ts';
import { ComputeError, errorCodeTraits, isComputeError } from '../domain/errors.ts';
import { computeHardwareKey } from '../domain/hardware-key.ts';
import { type CaMaterial, nodeSpiffeId, readCsr } from '../domain/pki.ts';
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
    const pool = await findPool(trx, { id: token.poolId });
    if (!pool) throw new ComputeError('INTERNAL', `the join token names a missing pool ${token.poolId}`);
    if (pool.archived) throw new ComputeError('INVALID_STATE', 'the join token names an archived pool');
    const existing = hardware.key ? await reclaimNodeByHardwareKey(trx, hardware.key) : null;
    const reclaimed = existing !== null;
    const node = existing
      ? { ...existing, poolId: existing.poolId ?? pool.id }
      : {
          ...(await insertJoinedNode(trx, {
            siteId: pool.siteId,
            poolId: pool.id,
            name: sanitizeName(request.requestedName, evidence?.hostname ?? ''),
            hardwareKey: hardware.key,
          })),
          siteId: pool.siteId,
          poolId: pool.id,
        };
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
