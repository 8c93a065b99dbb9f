import { existsSync, mkdirSync, readFileSync, renameSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { Metadata, status } from '@grpc/grpc-js';
import { jitteredBackoffMs } from '../domain/backoff.ts';
import { ComputeError } from '../domain/errors.ts';
import { certificateNotAfter, createCsr, generateKeyPairPem } from '../domain/pki.ts';
import { signReclaimProof } from '../domain/reclaim-proof.ts';
import {
  type HardwareEvidence,
  type JoinRequest,
  type JoinResponse,
  JoinServiceClient,
  type ReclaimProof,
} from '../proto/gen/agent/v1/agent.ts';
import { gatewayChannel } from './gateway-tls.ts';

/**
 * bcd's identity on disk under its state directory: `key.pem` (its ECDSA P-256 node key, never
 * sent anywhere), `cert.pem` (its node certificate), `ca.pem` (the control plane's CA) and
 * `node.json` (node id, name, site, pool, gateway).
 */
export interface NodeIdentity {
  nodeId: string;
  nodeName: string;
  siteId: string;
  poolId: string;
  spiffeId: string;
  gateway: string;
  privateKeyPem: string;
  publicKeyPem: string;
  certificatePem: string;
  caCertificatePem: string;
}

export function identityExists(dir: string): boolean {
  return existsSync(path.join(dir, 'node.json')) && existsSync(path.join(dir, 'cert.pem'));
}

export function loadIdentity(dir: string): NodeIdentity {
  const meta = JSON.parse(readFileSync(path.join(dir, 'node.json'), 'utf8'));
  return {
    ...meta,
    privateKeyPem: readFileSync(path.join(dir, 'key.pem'), 'utf8'),
    publicKeyPem: readFileSync(path.join(dir, 'key.pub.pem'), 'utf8'),
    certificatePem: readFileSync(path.join(dir, 'cert.pem'), 'utf8'),
    caCertificatePem: readFileSync(path.join(dir, 'ca.pem'), 'utf8'),
  };
}

export function saveCertificate(dir: string, certificatePem: string): void {
  writeFileSync(path.join(dir, 'cert.pem'), certificatePem, { mode: 0o644 });
}

function unary<T>(fn: (cb: (err: Error | null, res: T) => void) => void): Promise<T> {
  return new Promise((resolve, reject) => fn((err, res) => (err ? reject(err) : resolve(res))));
}

/**
 * The reclaim proof for a join from `dir`: when `dir` holds the identity of the node this machine
 * was, its key signs the new CSR (`signReclaimProof`), so JoinService may hand the node back;
 * without one (or with an unreadable one) the join asks for nothing more than a new node.
 */
export function reclaimProofFrom(dir: string, csrPem: string): ReclaimProof | undefined {
  if (!identityExists(dir)) return undefined;
  try {
    const previous = loadIdentity(dir);
    return signReclaimProof({
      nodeId: previous.nodeId,
      csrPem,
      previousPrivateKeyPem: previous.privateKeyPem,
    });
  } catch {
    return undefined;
  }
}

/**
 * How long a Join keeps trying, honouring the gateway's retry pushback and backing off from a
 * gateway out of reach. A budget of time, not of attempts: many machines behind one address (a
 * rack booting, a simulated fleet) are refused together again and again until the per-address rate
 * lets each in, and a gateway restarting during a herd is out of reach for a while.
 */
const joinRetryBudgetMs = 10 * 60_000;

/** One Join attempt's deadline: a gateway that stalls is tried again, not waited on for ever. */
const joinAttemptDeadlineMs = 60_000;

function pushbackMs(error: unknown): number | null {
  const e = error as { code?: number; metadata?: Metadata };
  if (e.code !== status.RESOURCE_EXHAUSTED) return null;
  const value = e.metadata?.get('grpc-retry-pushback-ms')[0];
  const ms = value === undefined ? Number.NaN : Number(value);
  return Number.isFinite(ms) && ms >= 0 ? Math.min(ms, 60_000) : null;
}

/**
 * Whether a failed Join may have never reached the gateway, or its reply was lost: the gateway
 * restarting, a connection reset or refused, a stream cut, an attempt past its deadline. Repeating it is safe:
 * the retry sends the same CSR, and JoinService answers a key it already certified with that
 * node and certificate without spending another use of the token.
 */
function isTransient(error: unknown): boolean {
  const code = (error as { code?: number }).code;
  // bcd never cancels its own Join: CANCELLED is the gateway resetting the stream (a forced
  // shutdown destroys its HTTP/2 sessions with NGHTTP2_CANCEL).
  return code === status.UNAVAILABLE || code === status.DEADLINE_EXCEEDED || code === status.CANCELLED;
}

/**
 * OpenSSL's reason when the gateway's certificate chain does not verify against the CA given (a
 * wrong or stale CA file): no outage, so not retried. gRPC reports it as UNAVAILABLE and names the
 * reason only in its details ("… Last error: Error: self-signed certificate in certificate chain").
 */
function untrustedGatewayReason(error: unknown): string | null {
  const { code, details } = error as { code?: number; details?: string };
  if (code !== status.UNAVAILABLE) return null;
  return /Last error: (?:Error: )?([^.]*certificate[^.]*)/i.exec(details ?? '')?.[1]?.trim() ?? null;
}

/** Capped exponential backoff (with jitter) between Join attempts to an unreachable gateway. */
export interface JoinBackoff {
  minMs: number;
  maxMs: number;
}

const defaultJoinBackoff: JoinBackoff = { minMs: 500, maxMs: 30_000 };

/**
 * Joins with a token: makes a key, sends a CSR and the hardware evidence to JoinService over TLS
 * (trusting only `caCertificatePem`), with a reclaim proof when `dir` holds a previous identity,
 * and writes the identity to `dir`. A throttled join (RESOURCE_EXHAUSTED with a retry pushback)
 * waits the pushback (up to twice it, at random) and tries again; a gateway out of reach
 * (UNAVAILABLE, a stream the gateway cut, an attempt past its deadline) is tried again after a capped exponential backoff
 * with jitter (`backoff`), the same request each time, within one budget of 10 minutes.
 */
export async function joinWithToken(input: {
  gateway: string;
  token: string;
  caCertificatePem: string;
  dir: string;
  evidence: HardwareEvidence;
  requestedName: string;
  agentVersion: string;
  backoff?: JoinBackoff;
  /** Called before each retry with the error and the wait (logs, tests). */
  onRetry?: (error: unknown, waitMs: number) => void;
}): Promise<NodeIdentity & { reclaimed: boolean }> {
  mkdirSync(input.dir, { recursive: true, mode: 0o700 });
  const keys = await generateKeyPairPem();
  const csrPem = await createCsr(keys, input.requestedName);
  const request: JoinRequest = {
    token: input.token,
    csrPem,
    evidence: input.evidence,
    requestedName: input.requestedName,
    agentVersion: input.agentVersion,
    reclaimProof: reclaimProofFrom(input.dir, csrPem),
  };
  const backoff = input.backoff ?? defaultJoinBackoff;
  // A gateway whose certificate does not name the address dialled is no outage: not retried.
  let identityRefused = false;
  const tls = gatewayChannel(input.gateway, { caCertificatePem: input.caCertificatePem }, () => {
    identityRefused = true;
  });
  const client = new JoinServiceClient(input.gateway, tls.credentials, tls.options);
  let response: JoinResponse;
  const started = Date.now(); // wall time: the retry budget of this process
  try {
    for (let failures = 0; ; ) {
      try {
        // wall time: a gRPC deadline is a point in wall time
        const deadline = new Date(Date.now() + joinAttemptDeadlineMs);
        response = await unary<JoinResponse>((cb) => client.join(request, new Metadata(), { deadline }, cb));
        break;
      } catch (error) {
        // (A certificate that does not name the address dialled is refused as it is, below.)
        const untrusted = identityRefused ? null : untrustedGatewayReason(error);
        if (untrusted) {
          throw new ComputeError(
            'INVALID_INPUT',
            `the gateway ${input.gateway} presented a certificate the CA given does not verify (${untrusted}): pass the control plane's CA certificate (its ca.pem) as --ca-file`,
            { gateway: input.gateway },
          );
        }
        const pushback = pushbackMs(error);
        let wait: number;
        if (pushback !== null) {
          // Up to twice the pushback, at random: a herd refused together comes back spread out.
          wait = pushback + Math.floor(Math.random() * pushback);
        } else if (isTransient(error) && !identityRefused) {
          wait = jitteredBackoffMs(++failures, backoff);
        } else {
          throw error;
        }
        if (Date.now() - started + wait > joinRetryBudgetMs) throw error; // wall time: the budget
        input.onRetry?.(error, wait);
        await new Promise((r) => setTimeout(r, wait));
      }
    }
  } finally {
    client.close();
  }
  const previousNodeId = request.reclaimProof?.nodeId;
  if (previousNodeId && previousNodeId !== response.nodeId) {
    // The machine became another node: the old node's journal (commands, converged generation)
    // must not speak for the new one. Kept aside, not deleted.
    const journal = path.join(input.dir, 'journal.json');
    if (existsSync(journal)) renameSync(journal, path.join(input.dir, `journal.${previousNodeId}.json`));
  }
  saveIdentity(input.dir, {
    nodeId: response.nodeId,
    nodeName: response.nodeName,
    siteId: response.siteId,
    poolId: response.poolId,
    spiffeId: response.spiffeId,
    gateway: input.gateway,
    privateKeyPem: keys.privateKeyPem,
    publicKeyPem: keys.publicKeyPem,
    certificatePem: response.certificatePem,
    caCertificatePem: response.caCertificatePem,
  });
  return { ...loadIdentity(input.dir), reclaimed: response.reclaimed };
}

/** Writes an identity to `dir` as `loadIdentity` reads it (the key readable by its owner only). */
export function saveIdentity(dir: string, identity: NodeIdentity): void {
  mkdirSync(dir, { recursive: true, mode: 0o700 });
  writeFileSync(path.join(dir, 'key.pem'), identity.privateKeyPem, { mode: 0o600 });
  writeFileSync(path.join(dir, 'key.pub.pem'), identity.publicKeyPem, { mode: 0o644 });
  saveCertificate(dir, identity.certificatePem);
  writeFileSync(path.join(dir, 'ca.pem'), identity.caCertificatePem, { mode: 0o644 });
  const meta = {
    nodeId: identity.nodeId,
    nodeName: identity.nodeName,
    siteId: identity.siteId,
    poolId: identity.poolId,
    spiffeId: identity.spiffeId,
    gateway: identity.gateway,
  };
  writeFileSync(path.join(dir, 'node.json'), `${JSON.stringify(meta, null, 2)}\n`);
}

/** Renews the certificate over mutual TLS with the current one (same key). */
export async function renewCertificate(identity: NodeIdentity, dir: string): Promise<Date> {
  const tls = gatewayChannel(identity.gateway, identity);
  const client = new JoinServiceClient(identity.gateway, tls.credentials, tls.options);
  try {
    const csrPem = await createCsr(
      { privateKeyPem: identity.privateKeyPem, publicKeyPem: identity.publicKeyPem },
      identity.nodeName,
    );
    const response = await unary<{ certificatePem: string; notAfterMs: number }>((cb) =>
      client.renew({ csrPem }, cb),
    );
    saveCertificate(dir, response.certificatePem);
    identity.certificatePem = response.certificatePem;
    return certificateNotAfter(response.certificatePem);
  } finally {
    client.close();
  }
}
