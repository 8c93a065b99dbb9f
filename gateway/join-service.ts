import { type handleUnaryCall, Metadata, status } from '@grpc/grpc-js';
import type { Transaction } from 'kysely';
import type { Database, Db } from '../core/database.ts';
import type { Logger } from '../core/logger.ts';
import type { OutageLog } from '../core/outage-log.ts';
import { isSiteJoinToken } from '../db/metal/site-tokens.ts';
import {
  findPeerCertificate,
  findReclaimPublicKeys,
  issueStoredNodeCertificate,
  lockUnrevokedCertificate,
  revokeNodeCertificates,
} from '../db/nodes/certificates.ts';
import { beginJoin, joinTokenUsedUp, refusedAtCommit, spendJoinToken } from '../db/nodes/join-tokens.ts';
import {
  insertJoinedNode,
  type JoinClaimedNode,
  lockJoinCandidates,
  lockJoinClaimedNode,
  markHardwareKeyConflict,
  reclaimJoinedNode,
  releaseHardwareKey,
} from '../db/nodes/nodes.ts';
import { ComputeError, errorCodeTraits, isComputeError } from '../domain/errors.ts';
import { computeHardwareKey } from '../domain/hardware-key.ts';
import { isDiscoveryToken } from '../domain/metal-discovery.ts';
import { type CaMaterial, nodeSpiffeId, readCsr } from '../domain/pki.ts';
import { verifyReclaimProof } from '../domain/reclaim-proof.ts';
import type {
  JoinRequest,
  JoinResponse,
  JoinServiceServer,
  ReclaimProof,
  RenewRequest,
  RenewResponse,
} from '../proto/gen/agent/v1/agent.ts';
import { checkJoinRequest, checkRenewRequest } from './message-bounds.ts';
import { normalizeNodeName } from './node-name.ts';
import { joinRamdisk } from './ramdisk-join.ts';
import { joinSiteAgent } from './site-join.ts';
import { verifiedPeer } from './tls.ts';
import { KeyedTokenBuckets, TokenBucket } from './token-bucket.ts';

type Trx = Transaction<Database>;

/** How fast machines without a certificate may call Join: per peer address, and in all. */
export interface JoinThrottleOptions {
  joinsPerSecondPerPeer: number;
  joinBurstPerPeer: number;
  joinsPerSecond: number;
  joinBurst: number;
}

export interface JoinServiceOptions {
  db: Db;
  log: Logger;
  ca: CaMaterial;
  trustDomain: string;
  /** Node certificate lifetime, at most 24 hours. */
  certificateTtlMs: number;
  /** The throttle in front of Join (none: unthrottled). */
  throttle?: JoinThrottle;
  /** Answers UNAVAILABLE, logged once per outage, while PostgreSQL is out of reach. */
  outage?: OutageLog;
}

/**
 * A ComputeError as a gRPC status, from the one table of codes; PostgreSQL or Temporal out of
 * reach is UNAVAILABLE (noted in `outage`); anything else is INTERNAL. A refusal that says when to
 * come back (`details.retryAfterMs`) carries `grpc-retry-pushback-ms`; one about a field names it
 * in `bc-error-field`.
 */
export function toGrpcError(
  thrown: unknown,
  log: Logger,
  outage?: OutageLog,
): { code: number; details: string; metadata: Metadata } {
  const metadata = new Metadata();
  const error = isComputeError(thrown) ? thrown : (outage?.unavailable(thrown, 'join') ?? thrown);
  if (isComputeError(error)) {
    metadata.set('bc-error-code', error.code);
    const retryAfterMs = error.details?.retryAfterMs;
    if (typeof retryAfterMs === 'number') metadata.set('grpc-retry-pushback-ms', String(retryAfterMs));
    const field = error.details?.field;
    if (typeof field === 'string') metadata.set('bc-error-field', field);
    return { code: errorCodeTraits[error.code].grpcStatus, details: error.message, metadata };
  }
  log.error({ err: error }, 'unexpected error');
  return { code: status.INTERNAL, details: 'internal error', metadata };
}

/** What a join does with the machine: reclaim a node it proved (or was approved) to be, or a new node. */
type JoinClaim =
  | { kind: 'reclaim'; node: JoinClaimedNode; by: 'proof' | 'approval'; hardwareKey?: string }
  | { kind: 'new'; conflict: JoinClaimedNode | null };

/**
 * Decides, under the row locks of the nodes involved, which node a joining machine becomes. A
 * reclaim stays within the token's pool (and its site) and needs either a reclaim proof (the
 * previous node key's signature over this join's CSR, verified against an unrevoked certificate
 * of that node) or an operator's nodes.approveReclaim in force; self-reported hardware evidence
 * alone never reclaims. A machine whose hardware key another live node holds, and that cannot
 * reclaim it, joins as a new node marked `HardwareKeyConflict`; the other node is not touched.
 */
async function decideJoinClaim(
  trx: Trx,
  log: Logger,
  input: {
    pool: { id: string; siteId: string };
    hardwareKey: string | null;
    /** The node holding `hardwareKey`, already locked (`lockJoinCandidates`). */
    holder: JoinClaimedNode | null;
    proof: ReclaimProof | undefined;
    csrPem: string;
  },
): Promise<JoinClaim> {
  const { pool } = input;
  let holder = input.holder;
  if (holder?.provisionState === 'retired') {
    await releaseHardwareKey(trx, holder.id);
    holder = null;
  }
  const inPool = (node: JoinClaimedNode) =>
    node.poolId === pool.id && node.siteId === pool.siteId && node.provisionState !== 'retired';
  const proof = input.proof;
  if (proof?.nodeId) {
    const claimed =
      holder?.id === proof.nodeId
        ? holder
        : await lockJoinClaimedNode(trx, { by: 'id', nodeId: proof.nodeId });
    const why = !claimed
      ? 'unknown node'
      : !inPool(claimed)
        ? 'the node is retired or outside the join token’s pool'
        : !(await proofVerifies(trx, claimed.id, proof, input.csrPem))
          ? 'the signature does not verify against an unrevoked certificate of the node'
          : null;
    if (claimed && why === null) {
      // The hardware key follows a proved machine when no other node holds it.
      const hardwareKey =
        input.hardwareKey && !holder && claimed.hardwareKey !== input.hardwareKey
          ? input.hardwareKey
          : undefined;
      return { kind: 'reclaim', node: claimed, by: 'proof', ...(hardwareKey ? { hardwareKey } : {}) };
    }
    log.warn({ claimedNodeId: proof.nodeId.slice(0, 100), poolId: pool.id, why }, 'reclaim proof refused');
  }
  if (!holder) return { kind: 'new', conflict: null };
  if (inPool(holder) && holder.reclaimApproved) return { kind: 'reclaim', node: holder, by: 'approval' };
  return { kind: 'new', conflict: holder };
}

async function proofVerifies(
  trx: Trx,
  nodeId: string,
  proof: ReclaimProof,
  csrPem: string,
): Promise<boolean> {
  if (proof.signature.length === 0) return false;
  const keys = await findReclaimPublicKeys(trx, nodeId, proof.keyId);
  return keys.some((publicKeyPem) =>
    verifyReclaimProof({ nodeId, csrPem, signature: proof.signature, publicKeyPem }),
  );
}

/**
 * Join: bounds every field first, checks the token, computes the hardware key, reclaims the node
 * the machine proves it is (`decideJoinClaim`; its old certificates revoked) or creates a new one,
 * signs the node certificate and records the token's use, all in one transaction whose commit spends
 * the use (a token used up meanwhile fails the commit: UNAUTHENTICATED, nothing of it kept).
 * INVALID_INPUT naming an oversized field; UNAUTHENTICATED for a bad token.
 */
export async function joinNode(options: JoinServiceOptions, request: JoinRequest): Promise<JoinResponse> {
  checkJoinRequest(request);
  if (isSiteJoinToken(request.token)) return joinSiteAgent(options, request);
  if (isDiscoveryToken(request.token)) return joinRamdisk(options, request);
  const csr = await readCsr(request.csrPem);
  const evidence = request.evidence;
  const hardware = computeHardwareKey({
    productUuid: evidence?.productUuid,
    serialNumber: evidence?.serialNumber,
    macs: evidence?.macs,
    gpuUuids: evidence?.gpuUuids,
  });
  // Logged once the commit, which spends the token's use, has succeeded.
  const joined: { announce?: () => void } = {};
  const response = await options.db
    .transaction()
    .execute(async (trx) => {
      // One round trip for the key lock, the token, its pool and the clock. The token's use is
      // spent by the commit itself (spendJoinToken), so concurrent joins with one token do not
      // queue behind each other's certificate signing or round trips.
      const start = await beginJoin(trx, request.token, csr.keyId);
      // The same key again (a retry whose reply was lost after the commit, under the key lock so a
      // duplicate in flight waits for the first): the node and certificate already made, answered
      // again without spending another use of the token.
      // The node holding the machine's hardware key is locked in the same round trip.
      const { repeat, holder } = await lockJoinCandidates(trx, {
        keyId: csr.keyId,
        hardwareKey: hardware.key,
      });
      if (repeat && repeat.poolId === start.poolId && repeat.provisionState !== 'retired') {
        options.log.info(
          { nodeId: repeat.nodeId, nodeName: repeat.nodeName, poolId: repeat.poolId },
          'join repeated with the same key: answered with the certificate already issued',
        );
        return {
          nodeId: repeat.nodeId,
          nodeName: repeat.nodeName,
          siteId: repeat.siteId,
          poolId: repeat.poolId,
          spiffeId: repeat.spiffeId,
          certificatePem: repeat.certificatePem,
          caCertificatePem: options.ca.certificatePem,
          notAfterMs: repeat.notAfter.getTime(),
          reclaimed: repeat.reclaimed,
        };
      }
      if (start.usedUp) throw joinTokenUsedUp();
      const pool = start.pool;
      if (!pool) throw new ComputeError('INTERNAL', `the join token names a missing pool ${start.poolId}`);
      if (pool.archived) throw new ComputeError('INVALID_STATE', 'the join token names an archived pool');
      const claim = await decideJoinClaim(trx, options.log, {
        pool,
        hardwareKey: hardware.key,
        holder,
        proof: request.reclaimProof,
        csrPem: request.csrPem,
      });
      let node: { id: string; name: string; siteId: string; poolId: string };
      if (claim.kind === 'reclaim') {
        await reclaimJoinedNode(trx, {
          nodeId: claim.node.id,
          reason: claim.by === 'proof' ? 'superseded' : 'reclaimed',
          ...(claim.hardwareKey ? { hardwareKey: claim.hardwareKey } : {}),
        });
        node = { id: claim.node.id, name: claim.node.name, siteId: claim.node.siteId, poolId: pool.id };
      } else {
        const inserted = await insertJoinedNode(trx, {
          siteId: pool.siteId,
          poolId: pool.id,
          name: normalizeNodeName(request.requestedName, evidence?.hostname ?? ''),
          hardwareKey: claim.conflict ? null : hardware.key,
        });
        if (claim.conflict) await markHardwareKeyConflict(trx, inserted.id, claim.conflict);
        node = { ...inserted, siteId: pool.siteId, poolId: pool.id };
      }
      const spiffeId = nodeSpiffeId(options.trustDomain, node.siteId, node.id);
      const cert = await issueStoredNodeCertificate(
        trx,
        options,
        {
          nodeId: node.id,
          nodeName: node.name,
          role: 'node',
          spiffeId,
          ...csr,
        },
        start.now,
      );
      await spendJoinToken(trx, { tokenId: start.tokenId, nodeId: node.id });
      const reclaimed = claim.kind === 'reclaim';
      const conflict = claim.kind === 'new' && claim.conflict;
      joined.announce = () =>
        options.log[conflict ? 'warn' : 'info'](
          {
            nodeId: node.id,
            nodeName: node.name,
            poolId: node.poolId,
            reclaimed,
            ...(reclaimed ? { reclaimedBy: claim.by } : {}),
            ...(conflict ? { hardwareKeyConflictWith: conflict.id } : {}),
            identifiers: hardware.identifiers,
          },
          conflict ? 'node joined with a hardware key conflict' : 'node joined',
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
    })
    .catch((error: unknown) => {
      throw refusedAtCommit(error);
    });
  joined.announce?.();
  return response;
}

/**
 * Renew: a node presenting its current, unrevoked certificate gets a new one for the CSR's key,
 * and every other certificate of the node is revoked as superseded in the same transaction (a
 * node holds one valid certificate; a live session on the old one ends at the next certificate
 * check, bcd reconnects with the new one). Two renewals with one certificate: the second is
 * UNAUTHENTICATED.
 */
export async function renewNodeCertificate(
  options: JoinServiceOptions,
  peer: { serial: string; spiffeId: string | null } | null,
  request: RenewRequest,
): Promise<RenewResponse> {
  checkRenewRequest(request);
  if (!peer) throw new ComputeError('UNAUTHENTICATED', 'renewal needs the node certificate (mutual TLS)');
  const current = await findPeerCertificate(options.db, peer.serial);
  if (!current || current.revoked || current.expired || current.spiffeId !== peer.spiffeId) {
    throw new ComputeError('UNAUTHENTICATED', 'the certificate is unknown, revoked or expired');
  }
  if (current.provisionState === 'retired') throw new ComputeError('ACCESS_DENIED', 'the node is retired');
  if (current.role === 'ramdisk') {
    // The discovery attestor's bound: a ramdisk's identity never outlives its 2 hours.
    throw new ComputeError('INVALID_STATE', 'a ramdisk certificate is not renewed: it lasts at most 2 hours');
  }
  const csr = await readCsr(request.csrPem);
  return options.db.transaction().execute(async (trx) => {
    if (!(await lockUnrevokedCertificate(trx, current.serial))) {
      throw new ComputeError('UNAUTHENTICATED', 'the certificate is unknown, revoked or expired');
    }
    const cert = await issueStoredNodeCertificate(trx, options, {
      nodeId: current.nodeId,
      nodeName: current.nodeName,
      role: current.role,
      spiffeId: current.spiffeId,
      ...csr,
    });
    const superseded = await revokeNodeCertificates(trx, current.nodeId, {
      reason: 'superseded',
      exceptSerial: cert.serial,
    });
    options.log.info(
      { nodeId: current.nodeId, serial: cert.serial, supersededCertificates: superseded },
      'node certificate renewed',
    );
    return {
      certificatePem: cert.certificatePem,
      caCertificatePem: options.ca.certificatePem,
      notAfterMs: cert.notAfter.getTime(),
    };
  });
}

/** The address of a gRPC peer without its port (`127.0.0.1:5555` → `127.0.0.1`). */
function peerAddress(peer: string): string {
  const colon = peer.lastIndexOf(':');
  return colon > 0 ? peer.slice(0, colon) : peer;
}

/**
 * The throttle in front of the unauthenticated Join: a token bucket per peer address and one for
 * all peers. Over either, Join answers RESOURCE_EXHAUSTED (RATE_LIMITED) with
 * `grpc-retry-pushback-ms`, before reading anything of the request.
 */
export class JoinThrottle {
  private readonly perPeer: KeyedTokenBuckets;
  private readonly global: TokenBucket;
  refused = 0;

  constructor(options: JoinThrottleOptions) {
    this.perPeer = new KeyedTokenBuckets(options.joinsPerSecondPerPeer, options.joinBurstPerPeer);
    this.global = new TokenBucket(options.joinsPerSecond, options.joinBurst);
  }

  /** Null when the call may go on, else the refusal. */
  admit(peer: string): ComputeError | null {
    let waitMs = this.perPeer.take(peerAddress(peer));
    const scope = waitMs > 0 ? 'this address' : 'all machines';
    if (waitMs === 0 && !this.global.take()) waitMs = Math.max(1, this.global.waitMs());
    if (waitMs === 0) return null;
    this.refused++;
    // Jittered, so machines refused together do not come back together.
    const retryAfterMs = Math.round(waitMs + Math.random() * Math.max(250, waitMs));
    return new ComputeError('RATE_LIMITED', `too many joins from ${scope}; retry in ${retryAfterMs} ms`, {
      retryAfterMs,
    });
  }
}

/** The JoinService implementation for @grpc/grpc-js. */
export function createJoinService(options: JoinServiceOptions): JoinServiceServer {
  const throttle = options.throttle;
  const join: handleUnaryCall<JoinRequest, JoinResponse> = (call, callback) => {
    const peer = call.getPeer();
    const limited = throttle?.admit(peer);
    if (limited) {
      options.log.debug({ peer, retryAfterMs: limited.details?.retryAfterMs }, 'join throttled');
      callback(toGrpcError(limited, options.log));
      return;
    }
    joinNode(options, call.request).then(
      (response) => callback(null, response),
      (error) => {
        if (isComputeError(error))
          options.log.warn(
            { peer, code: error.code, err: error.message, details: error.details },
            'join refused',
          );
        callback(toGrpcError(error, options.log, options.outage));
      },
    );
  };
  const renew: handleUnaryCall<RenewRequest, RenewResponse> = (call, callback) => {
    renewNodeCertificate(options, verifiedPeer(call), call.request).then(
      (response) => callback(null, response),
      (error) => {
        if (isComputeError(error))
          options.log.warn({ peer: call.getPeer(), code: error.code }, 'renewal refused');
        callback(toGrpcError(error, options.log, options.outage));
      },
    );
  };
  return { join, renew };
}
