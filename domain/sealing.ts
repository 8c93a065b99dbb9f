import { createCipheriv, createDecipheriv, hkdfSync, randomBytes } from 'node:crypto';

/**
 * Sealing at rest: the secrets the control plane must be able to read back (the CA private key,
 * webhook signing secrets, BMC credentials) are stored encrypted with a key derived from the
 * deployment secret (`BETTER_COMPUTE_SECRET`, the specification's `secret` option).
 *
 * - One key per purpose: HKDF-SHA256 of the deployment secret with the purpose as `info`.
 * - AES-256-GCM with a random 12-byte nonce; the header (`sealed:v1:<purpose>`) is the additional
 *   authenticated data, so a value sealed for one purpose cannot be opened as another, nor its
 *   header rewritten.
 * - A self-describing text form: `sealed:v1:<purpose>:<base64 of nonce | ciphertext | tag>`.
 */

/** What a sealed value is for; each purpose has its own derived key. */
export const sealingPurposes = ['ca-key', 'webhook-secret', 'bmc-credential'] as const;
export type SealingPurpose = (typeof sealingPurposes)[number];

/** The shortest deployment secret accepted. */
export const minDeploymentSecretLength = 32;

/** How to make a deployment secret, for error messages and the README. */
export const deploymentSecretHint = 'generate one with `openssl rand -base64 48`';

/**
 * A value sealed for purpose `P`. Only `Sealer.seal` makes one, so a column typed with it (see
 * core/database.ts) can never be written with plaintext.
 */
export type Sealed<P extends SealingPurpose> = string & { readonly sealedFor: P };

/** A sealed value that cannot be opened: not sealed, sealed for another purpose, another secret, or altered. */
export class SealedValueError extends Error {
  override readonly name = 'SealedValueError';
}

const prefix = 'sealed:';
const version = 'v1';
const nonceBytes = 12;
const tagBytes = 16;
// A fixed salt: the deployment secret is the only secret input; the salt only separates this use.
const hkdfSalt = Buffer.from('better-compute/sealing/v1');

/** Whether `value` has the sealed form (any version or purpose); plaintext never starts so. */
export function isSealed(value: string): boolean {
  return value.startsWith(prefix);
}

export interface Sealer {
  /** Seals `plaintext` for `purpose` (a fresh nonce each time, so equal inputs seal differently). */
  seal<P extends SealingPurpose>(purpose: P, plaintext: string): Sealed<P>;
  /**
   * Opens a value sealed for `purpose` with this deployment secret. Throws SealedValueError when it
   * is not a sealed value, is sealed for another purpose, or does not authenticate (another
   * deployment secret, or altered).
   */
  open(purpose: SealingPurpose, sealed: string): string;
}

/**
 * A sealer for one deployment secret (at least 32 characters). Keys are derived on first use of
 * each purpose and kept for the sealer's life.
 */
export function createSealer(secret: string): Sealer {
  if (typeof secret !== 'string' || secret.length < minDeploymentSecretLength) {
    throw new SealedValueError(
      `the deployment secret must be at least ${minDeploymentSecretLength} characters: ${deploymentSecretHint}`,
    );
  }
  const keys = new Map<SealingPurpose, Buffer>();
  const keyOf = (purpose: SealingPurpose) => {
    let key = keys.get(purpose);
    if (!key) {
      key = Buffer.from(hkdfSync('sha256', Buffer.from(secret, 'utf8'), hkdfSalt, purpose, 32));
      keys.set(purpose, key);
    }
    return key;
  };
  return {
    seal<P extends SealingPurpose>(purpose: P, plaintext: string): Sealed<P> {
      assertPurpose(purpose);
      const header = `${prefix}${version}:${purpose}`;
      const nonce = randomBytes(nonceBytes);
      const cipher = createCipheriv('aes-256-gcm', keyOf(purpose), nonce);
      cipher.setAAD(Buffer.from(header, 'utf8'));
      const ciphertext = Buffer.concat([cipher.update(plaintext, 'utf8'), cipher.final()]);
      const payload = Buffer.concat([nonce, ciphertext, cipher.getAuthTag()]).toString('base64');
      return `${header}:${payload}` as Sealed<P>;
    },
    open(purpose: SealingPurpose, sealed: string): string {
      assertPurpose(purpose);
      const parts = typeof sealed === 'string' ? sealed.split(':') : [];
      if (parts.length !== 4 || `${parts[0]}:` !== prefix) {
        throw new SealedValueError(`the stored ${purpose} is not a sealed value`);
      }
      const [, sealedVersion, sealedPurpose, payload] = parts as [string, string, string, string];
      if (sealedVersion !== version) {
        throw new SealedValueError(
          `the stored ${purpose} is sealed in format ${sealedVersion}, which this version cannot read`,
        );
      }
      if (sealedPurpose !== purpose) {
        throw new SealedValueError(`the stored ${purpose} holds a sealed ${sealedPurpose}, not a ${purpose}`);
      }
      const bytes = Buffer.from(payload, 'base64');
      if (bytes.length < nonceBytes + tagBytes) {
        throw new SealedValueError(`the stored ${purpose} is truncated`);
      }
      const decipher = createDecipheriv('aes-256-gcm', keyOf(purpose), bytes.subarray(0, nonceBytes));
      decipher.setAAD(Buffer.from(`${prefix}${version}:${purpose}`, 'utf8'));
      decipher.setAuthTag(bytes.subarray(bytes.length - tagBytes));
      try {
        return Buffer.concat([
          decipher.update(bytes.subarray(nonceBytes, bytes.length - tagBytes)),
          decipher.final(),
        ]).toString('utf8');
      } catch {
        throw new SealedValueError(
          `the stored ${purpose} cannot be opened with this deployment secret: has BETTER_COMPUTE_SECRET (the \`secret\` option) changed since it was sealed? Every process of a deployment needs the same one (or the stored value was altered)`,
        );
      }
    },
  };
}

function assertPurpose(purpose: string): asserts purpose is SealingPurpose {
  if (!(sealingPurposes as readonly string[]).includes(purpose)) {
    throw new SealedValueError(`unknown sealing purpose '${purpose}'`);
  }
}
