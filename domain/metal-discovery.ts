import { createHash, createPrivateKey, createPublicKey, sign, verify } from 'node:crypto';
import { keyIdOfPublicKey } from './pki.ts';

/**
 * The `discovery` attestor: a ramdisk that a site agent network-booted joins with a single-use
 * discovery token (`bcdt_<id>.<secret>`, minted for one machine by a provisioning workflow) and
 * the site agent's assertion that it served that machine's boot: the site agent's node key
 * (ECDSA P-256) signs `bc-discovery-v1\n<machine node id>\n<token id>\n<lease epoch>\n<hex
 * SHA-256 of the ramdisk's CSR>`. The gateway checks it against the key of the site agent that
 * holds the site's boot lease at that epoch, so neither a leaked token alone nor a stale boot
 * server can enrol a ramdisk. The ramdisk's certificate lasts at most 2 hours and allows only the
 * commissioning command kinds.
 */

export const discoveryPurpose = 'bc-discovery-v1';
/** The longest a ramdisk certificate lives. */
export const ramdiskCertificateMaxMs = 2 * 3_600_000;
export const discoveryTokenPattern = /^bcdt_([0-9a-z]{26})\.([A-Za-z0-9_-]{43})$/;

export function isDiscoveryToken(token: string): boolean {
  return token.trim().startsWith('bcdt_');
}

export interface DiscoveryClaim {
  machineNodeId: string;
  tokenId: string;
  leaseEpoch: number;
  csrPem: string;
}

/** The bytes the site agent signs for one ramdisk join. */
export function discoveryAssertionBytes(claim: DiscoveryClaim): Buffer {
  const csrHash = createHash('sha256').update(claim.csrPem, 'utf8').digest('hex');
  return Buffer.from(
    `${discoveryPurpose}\n${claim.machineNodeId}\n${claim.tokenId}\n${claim.leaseEpoch}\n${csrHash}`,
    'utf8',
  );
}

/** The site agent's assertion: its key id and its signature (ECDSA P-256, SHA-256, DER). */
export function signDiscoveryAssertion(
  claim: DiscoveryClaim,
  siteAgentPrivateKeyPem: string,
): { keyId: string; signature: Buffer } {
  const key = createPrivateKey(siteAgentPrivateKeyPem);
  const publicKeyPem = createPublicKey(key).export({ format: 'pem', type: 'spki' }).toString();
  return {
    keyId: keyIdOfPublicKey(publicKeyPem),
    signature: sign('sha256', discoveryAssertionBytes(claim), key),
  };
}

/** Whether `signature` is the site agent key's assertion of `claim`. Pure; malformed input is false. */
export function verifyDiscoveryAssertion(
  claim: DiscoveryClaim,
  signature: Uint8Array,
  siteAgentPublicKeyPem: string,
): boolean {
  try {
    return verify(
      'sha256',
      discoveryAssertionBytes(claim),
      createPublicKey(siteAgentPublicKeyPem),
      signature,
    );
  } catch {
    return false;
  }
}

/** The token id inside a discovery token, or null for a malformed one. */
export function discoveryTokenId(token: string): string | null {
  const match = discoveryTokenPattern.exec(token.trim());
  return match ? `dt_${match[1]}` : null;
}
