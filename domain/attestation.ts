import { createPrivateKey, createPublicKey, sign, verify } from 'node:crypto';
import { type AllocationBound, AllocationReport, type AttestedReport } from '../proto/gen/agent/v1/agent.ts';
import { keyIdOfPublicKey } from './pki.ts';

/**
 * Attested reports: a node signs what it did with an allocation (bound, failed, released) with its
 * own key, the gateway stores the bytes as received, and the worker verifies them before a binding
 * counts, so a compromised gateway cannot claim a binding the node never made.
 */

export const attestedReportPurpose = 'attested-report';

/** Roles whose certificates may attest workload bindings. */
export const workloadRoles = ['node', 'node-tenant'] as const;

/** The grace after a certificate's expiry within which its reports still verify (offline nodes). */
export const defaultOfflineGraceMs = 6 * 60 * 60 * 1000;

/** Encodes and signs a report with the node key (ECDSA P-256, SHA-256, DER signature). */
export function signAllocationReport(report: AllocationReport, privateKeyPem: string): AttestedReport {
  const body = Buffer.from(AllocationReport.encode(report).finish());
  const privateKey = createPrivateKey(privateKeyPem);
  const publicKeyPem = createPublicKey(privateKey).export({ format: 'pem', type: 'spki' }).toString();
  return {
    body,
    keyId: keyIdOfPublicKey(publicKeyPem),
    signature: sign('sha256', body, privateKey),
  };
}

/** Decodes a report body without trusting it (the gateway reads which allocation it names). */
export function decodeAllocationReport(body: Uint8Array): AllocationReport | null {
  try {
    return AllocationReport.decode(body);
  } catch {
    return null;
  }
}

/** A certificate as stored in node_certificates, for verification. */
export interface AttestationCertificate {
  nodeId: string;
  role: string;
  keyId: string;
  publicKeyPem: string;
  notAfter: Date;
  revokedAt: Date | null;
}

export interface AttestedBinding {
  cdiDevices: string[];
  envFile: string;
  cdiSpecFile: string;
  /** Kept only when it is exactly `bcd-alloc-<allocation>.slice`. */
  cgroupParent: string | null;
  gpuUuids: string[];
}

export type AttestationVerdict =
  | { ok: true; report: AllocationReport; binding: AttestedBinding | null }
  | { ok: false; reason: string };

/**
 * Verifies a stored report about `allocationId` on `nodeId`. Pure: the caller passes the node's
 * certificates (any that match `keyId`). Accepts only when the report is signed by a certificate of
 * that node (current, or expired within the offline grace, never revoked) whose role runs
 * workloads, the signature verifies, and the signed body reports exactly this allocation bound
 * (or `kind`; and, for a binding with `expectedGpuUuids`, exactly those GPUs). Every refusal names its reason:
 * `unsigned report`, `unknown signing key`, `signed by a key of another node`, `signing certificate
 * revoked`, `signing certificate expired`, `signing certificate role cannot run workloads`,
 * `signature does not verify`, `malformed report`, `the signed report is not this allocation bound`.
 */
export function verifyAttestedReport(input: {
  body: Uint8Array | null;
  keyId: string | null;
  signature: Uint8Array | null;
  allocationId: string;
  nodeId: string;
  certificates: readonly AttestationCertificate[];
  now: Date;
  expectedGpuUuids?: readonly string[];
  /** The kind the report must be (default `bound`). */
  kind?: 'bound' | 'failed' | 'released';
  offlineGraceMs?: number;
  roles?: readonly string[];
}): AttestationVerdict {
  const { body, keyId, signature } = input;
  if (!body || body.length === 0 || !keyId || !signature || signature.length === 0) {
    return { ok: false, reason: 'unsigned report' };
  }
  const matching = input.certificates.filter((c) => c.keyId === keyId);
  if (matching.length === 0) return { ok: false, reason: 'unknown signing key' };
  const own = matching.filter((c) => c.nodeId === input.nodeId);
  if (own.length === 0) return { ok: false, reason: 'signed by a key of another node' };
  if (own.some((c) => c.revokedAt !== null)) return { ok: false, reason: 'signing certificate revoked' };
  const grace = input.offlineGraceMs ?? defaultOfflineGraceMs;
  const live = own.filter((c) => c.notAfter.getTime() + grace > input.now.getTime());
  if (live.length === 0) return { ok: false, reason: 'signing certificate expired' };
  const roles = input.roles ?? workloadRoles;
  const cert = live.find((c) => roles.includes(c.role));
  if (!cert) return { ok: false, reason: 'signing certificate role cannot run workloads' };
  let verified = false;
  try {
    verified = verify('sha256', body, createPublicKey(cert.publicKeyPem), signature);
  } catch {
    verified = false;
  }
  if (!verified) return { ok: false, reason: 'signature does not verify' };
  const report = decodeAllocationReport(body);
  if (!report) return { ok: false, reason: 'malformed report' };
  const kind = input.kind ?? 'bound';
  const notThis = { ok: false, reason: `the signed report is not this allocation ${kind}` } as const;
  if (
    report.purpose !== attestedReportPurpose ||
    report.nodeId !== input.nodeId ||
    report.allocationId !== input.allocationId ||
    report.kind?.$case !== kind
  ) {
    return notThis;
  }
  if (report.kind.$case !== 'bound') return { ok: true, report, binding: null };
  const bound: AllocationBound = report.kind.value;
  if (input.expectedGpuUuids) {
    const want = [...input.expectedGpuUuids].sort().join(',');
    if ([...bound.gpuUuids].sort().join(',') !== want) return notThis;
    const names = [...input.expectedGpuUuids]
      .map((u) => `bcd.dev/gpu=${u}`)
      .sort()
      .join(',');
    if ([...bound.cdiDevices].sort().join(',') !== names) return notThis;
  }
  const slice = `bcd-alloc-${input.allocationId}.slice`;
  return {
    ok: true,
    report,
    binding: {
      cdiDevices: [...bound.cdiDevices],
      envFile: bound.envFile,
      cdiSpecFile: bound.cdiSpecFile,
      cgroupParent: bound.cgroupParent === slice ? slice : null,
      gpuUuids: [...bound.gpuUuids],
    },
  };
}
