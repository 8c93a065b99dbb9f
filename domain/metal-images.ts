import { createPrivateKey, createPublicKey, sign, verify } from 'node:crypto';
import { z } from 'zod';
import { ComputeError } from './errors.ts';
import { releaseKeyPin, releasePinPattern } from './release-manifest.ts';

/**
 * Images for bare-metal deploys: `name@version`, a format, and the SHA-256 of their bytes (they
 * are content-addressed: a deploy streams the URL and fails on any other digest). An image is
 * `verified` only when its Ed25519 signature checks against the deployment's image signer pins
 * (BETTER_COMPUTE_IMAGE_SIGNER_PINS, the same pin form as release signers); any other image stays
 * private to the tenant that registered it.
 */

export const imageFormats = ['raw', 'qcow2', 'iso'] as const;
export type ImageFormat = (typeof imageFormats)[number];

export const imageNameSchema = z
  .string()
  .regex(/^[a-z0-9][a-z0-9._-]{0,62}$/, "an image name: lower-case letters, digits, '.', '_' or '-'");
export const imageVersionSchema = z
  .string()
  .regex(/^[A-Za-z0-9][A-Za-z0-9._+-]{0,62}$/, 'a version such as 24.04 or 2026.11.1');
export const sha256Schema = z.string().regex(/^[0-9a-f]{64}$/, 'a SHA-256 digest: 64 lower-case hex digits');

export const imageSignatureSchema = z.strictObject({
  keyId: z.string().regex(releasePinPattern, 'a key pin: sha256/<base64 of the key hash>'),
  publicKey: z.string().regex(/^[A-Za-z0-9+/=]{40,200}$/, 'base64 of an Ed25519 public key (SPKI DER)'),
  signature: z.string().regex(/^[A-Za-z0-9+/=]{80,100}$/, 'base64 of a 64-byte Ed25519 signature'),
});
export type ImageSignature = z.infer<typeof imageSignatureSchema>;

export interface ImageIdentity {
  name: string;
  version: string;
  format: ImageFormat;
  sha256: string;
}

/** The bytes an image signature covers: a domain tag, the name, version, format and digest. */
export function imageSigningBytes(image: ImageIdentity): Buffer {
  return Buffer.from(`bc-image-v1\n${image.name}@${image.version}\n${image.format}\n${image.sha256}`, 'utf8');
}

/** Signs an image's identity with an Ed25519 private key (PKCS#8 PEM), as `images sign` does. */
export function signImage(image: ImageIdentity, privateKeyPem: string): ImageSignature {
  const key = createPrivateKey(privateKeyPem);
  if (key.asymmetricKeyType !== 'ed25519') {
    throw new ComputeError('INVALID_INPUT', 'an image signing key must be Ed25519 (PKCS#8 PEM)');
  }
  const publicKey = createPublicKey(key).export({ format: 'der', type: 'spki' }).toString('base64');
  return {
    keyId: releaseKeyPin(publicKey),
    publicKey,
    signature: sign(null, imageSigningBytes(image), key).toString('base64'),
  };
}

/**
 * Checks an image signature: it must verify over the image's identity with the key it names
 * (INVALID_INPUT `signature: …` otherwise: a wrong signature is refused, not stored). Answers
 * whether its key is one of `pins` (then the image is verified) and the key's pin.
 */
export function checkImageSignature(
  image: ImageIdentity,
  signature: ImageSignature,
  pins: readonly string[],
): { verified: boolean; pin: string } {
  let pin: string;
  try {
    pin = releaseKeyPin(signature.publicKey);
  } catch {
    throw new ComputeError('INVALID_INPUT', 'signature: its public key is not an Ed25519 key');
  }
  if (pin !== signature.keyId) {
    throw new ComputeError(
      'INVALID_INPUT',
      `signature: keyId ${signature.keyId} is not the pin of the key given (${pin})`,
    );
  }
  const key = createPublicKey({
    key: Buffer.from(signature.publicKey, 'base64'),
    format: 'der',
    type: 'spki',
  });
  if (!verify(null, imageSigningBytes(image), key, Buffer.from(signature.signature, 'base64'))) {
    throw new ComputeError(
      'INVALID_INPUT',
      `signature: it does not verify over ${image.name}@${image.version} (${image.format}, sha256 ${image.sha256}): sign exactly these`,
    );
  }
  return { verified: pins.includes(pin), pin };
}
