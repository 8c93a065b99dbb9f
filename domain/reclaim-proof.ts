import { createHash, createPrivateKey, createPublicKey, sign, verify } from 'node:crypto';
import type { ReclaimProof } from '../proto/gen/agent/v1/agent.ts';
import { keyIdOfPublicKey } from './pki.ts';

/**
 * Reclaim proofs: a machine joining again proves it is the node it was by signing the new join's
 * CSR with its previous node key. The proof is bound to that CSR (its SHA-256), so a captured
 * proof only ever helps the holder of the CSR's private key; it names the node, so it cannot be
 * presented for another one.
 */

export const reclaimProofPurpose = 'bc-reclaim-v1';

/** The bytes a reclaim proof signs: `bc-reclaim-v1\n<nodeId>\n<hex SHA-256 of csrPem>`. */
export function reclaimProofPayload(nodeId: string, csrPem: string): Buffer {
  const csrHash = createHash('sha256').update(csrPem, 'utf8').digest('hex');
  return Buffer.from(`${reclaimProofPurpose}\n${nodeId}\n${csrHash}`, 'utf8');
}

/** Signs the proof for `csrPem` with the previous node key (ECDSA P-256, SHA-256, DER). */
export function signReclaimProof(input: {
  nodeId: string;
  csrPem: string;
  previousPrivateKeyPem: string;
}): ReclaimProof {
  const privateKey = createPrivateKey(input.previousPrivateKeyPem);
  const publicKeyPem = createPublicKey(privateKey).export({ format: 'pem', type: 'spki' }).toString();
  return {
    nodeId: input.nodeId,
    keyId: keyIdOfPublicKey(publicKeyPem),
    signature: sign('sha256', reclaimProofPayload(input.nodeId, input.csrPem), privateKey),
  };
}

/**
 * Whether `signature` is the node key's signature over this join's CSR: true only when it
 * verifies against `publicKeyPem` (an unrevoked certificate's key of `nodeId`, chosen by the
 * caller). Pure; a malformed key or signature is simply false.
 */
export function verifyReclaimProof(input: {
  nodeId: string;
  csrPem: string;
  signature: Uint8Array;
  publicKeyPem: string;
}): boolean {
  try {
    return verify(
      'sha256',
      reclaimProofPayload(input.nodeId, input.csrPem),
      createPublicKey(input.publicKeyPem),
      input.signature,
    );
  } catch {
    return false;
  }
}
