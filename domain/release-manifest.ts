import {
  createHash,
  createPrivateKey,
  createPublicKey,
  generateKeyPairSync,
  sign,
  verify,
} from 'node:crypto';
import { z } from 'zod';
import { ComputeError } from './errors.ts';
import { canonicalJson } from './node-spec.ts';
import { compareVersions, versionPattern } from './release-version.ts';

/**
 * A release: the manifest of one bcd version's files (path, size, SHA-256), its protocol version,
 * the oldest control plane that may run it, its channel and its expiry, signed offline with Ed25519
 * keys that verifiers know only by their pins (`sha256/<base64 of SHA-256 of the public key's
 * SubjectPublicKeyInfo DER>`). The control plane and bcd run the same checks (`verifyRelease`).
 */

const sha256Hex = z.string().regex(/^[0-9a-f]{64}$/, 'a hex SHA-256 (64 lower-case hex digits)');

/** One part of a file's path: letters, digits, '_', '.', '-', but never '.' or '..' (no lookahead, so
 * every JSON Schema tool can generate and check it). */
const pathPart = String.raw`(?:[A-Za-z0-9_-][A-Za-z0-9_.-]*|\.[A-Za-z0-9_-][A-Za-z0-9_.-]*|\.\.[A-Za-z0-9_.-]+)`;

export const releaseFileSchema = z.strictObject({
  path: z
    .string()
    .regex(
      new RegExp(`^${pathPart}(?:\\/${pathPart})*$`),
      "a relative path of letters, digits, '_', '.', '-' and '/' (no '.' or '..' parts, no leading '/')",
    )
    .max(200),
  size: z
    .number()
    .int()
    .min(0)
    .max(1 << 30),
  sha256: sha256Hex,
});

export const releaseManifestSchema = z.strictObject({
  /** Rollback protection is per channel: a version not above the channel's newest is refused. */
  channel: z
    .string()
    .regex(/^[a-z0-9][a-z0-9-]{0,31}$/, 'a channel such as stable')
    .default('stable'),
  version: z.string().regex(versionPattern, 'a version such as 1.4.2'),
  protocolVersion: z.number().int().min(1).max(1000),
  minControlPlaneVersion: z.string().regex(versionPattern, 'a version such as 0.1.0'),
  /** Distinct paths (checkReleaseFiles refuses a repeated one). */
  files: z.array(releaseFileSchema).min(1).max(256),
  /** ISO 8601; a release past it is refused everywhere (and its rollouts stop starting nodes). */
  expiresAt: z.iso.datetime({ offset: true }),
  notes: z.string().max(2000).optional(),
});

export type ReleaseManifest = z.infer<typeof releaseManifestSchema>;
export type ReleaseFile = z.infer<typeof releaseFileSchema>;

export const releasePinPattern = /^sha256\/[A-Za-z0-9+/]{43}=$/;

export const releaseSignatureSchema = z.strictObject({
  /** The signer's pin, `sha256/<base64>`. */
  keyId: z.string().regex(releasePinPattern, 'a key pin: sha256/<base64 of the key hash>'),
  /** The Ed25519 public key, base64 of its SubjectPublicKeyInfo DER; its pin must be `keyId`. */
  publicKey: z.string().regex(/^[A-Za-z0-9+/=]{40,200}$/, 'base64 of an Ed25519 public key (SPKI DER)'),
  /** base64 of the Ed25519 signature over `releaseSigningBytes(manifest)`. */
  signature: z.string().regex(/^[A-Za-z0-9+/=]{80,100}$/, 'base64 of a 64-byte Ed25519 signature'),
});

export type ReleaseSignature = z.infer<typeof releaseSignatureSchema>;

/** The trust a verifier holds: the pinned signers and how many distinct ones must have signed. */
export interface ReleaseTrust {
  pins: readonly string[];
  threshold: number;
}

/** Why a release is refused: one closed set, shared by the control plane and bcd. */
export const releaseRefusals = [
  'bad-signature',
  'unpinned-key',
  'below-threshold',
  'digest-mismatch',
  'expired',
  'downgrade',
  'protocol-unsupported',
  'control-plane-too-old',
  'no-trust',
] as const;
export type ReleaseRefusal = (typeof releaseRefusals)[number];

/** The field of `releases.publish` each refusal is about (`details.field`). */
const refusedField: Record<ReleaseRefusal, string> = {
  'bad-signature': 'signatures',
  'unpinned-key': 'signatures',
  'below-threshold': 'signatures',
  'no-trust': 'signatures',
  'digest-mismatch': 'files',
  expired: 'manifest.expiresAt',
  downgrade: 'manifest.version',
  'protocol-unsupported': 'manifest.protocolVersion',
  'control-plane-too-old': 'manifest.minControlPlaneVersion',
};

/**
 * A refused release: INVALID_INPUT (CONFLICT for a downgrade) with `details.refusal` and the field
 * it is about (`details.field`).
 */
export function releaseRefused(refusal: ReleaseRefusal, message: string): ComputeError {
  return new ComputeError(refusal === 'downgrade' ? 'CONFLICT' : 'INVALID_INPUT', message, {
    refusal,
    field: refusedField[refusal],
  });
}

/** The bytes a release signature covers: a domain tag and the manifest's canonical JSON. */
export function releaseSigningBytes(manifest: ReleaseManifest): Buffer {
  return Buffer.from(`bc-release-v1\n${canonicalJson(manifest)}`, 'utf8');
}

/** The hex SHA-256 of the manifest's canonical JSON: the release's content id. */
export function manifestDigest(manifest: ReleaseManifest): string {
  return createHash('sha256').update(canonicalJson(manifest)).digest('hex');
}

/** The pin of a public key (PEM, or base64 of its SPKI DER): `sha256/<base64 of SHA-256 of the DER>`. */
export function releaseKeyPin(publicKey: string): string {
  const der = publicKeyDer(publicKey);
  return `sha256/${createHash('sha256').update(der).digest('base64')}`;
}

function publicKeyDer(publicKey: string): Buffer {
  const key = publicKey.includes('BEGIN')
    ? createPublicKey(publicKey)
    : createPublicKey({ key: Buffer.from(publicKey, 'base64'), format: 'der', type: 'spki' });
  if (key.asymmetricKeyType !== 'ed25519') {
    throw new ComputeError('INVALID_INPUT', 'a release signing key must be Ed25519');
  }
  return key.export({ format: 'der', type: 'spki' });
}

/** A new Ed25519 signing key (PKCS#8 PEM) with its public key (SPKI PEM) and pin. */
export function generateReleaseSigningKey(): { privateKeyPem: string; publicKeyPem: string; pin: string } {
  const { privateKey, publicKey } = generateKeyPairSync('ed25519');
  const publicKeyPem = publicKey.export({ format: 'pem', type: 'spki' }).toString();
  return {
    privateKeyPem: privateKey.export({ format: 'pem', type: 'pkcs8' }).toString(),
    publicKeyPem,
    pin: releaseKeyPin(publicKeyPem),
  };
}

/**
 * Signs a manifest with an Ed25519 private key (PKCS#8 PEM), as `releases sign` does off the
 * control plane. INVALID_INPUT when the key is not Ed25519.
 */
export function signRelease(manifest: ReleaseManifest, privateKeyPem: string): ReleaseSignature {
  const key = createPrivateKey(privateKeyPem);
  if (key.asymmetricKeyType !== 'ed25519') {
    throw new ComputeError('INVALID_INPUT', 'a release signing key must be Ed25519 (PKCS#8 PEM)');
  }
  const der = createPublicKey(key).export({ format: 'der', type: 'spki' });
  const publicKey = der.toString('base64');
  return {
    keyId: releaseKeyPin(publicKey),
    publicKey,
    signature: sign(null, releaseSigningBytes(manifest), key).toString('base64'),
  };
}

/**
 * Checks a release's signatures against `trust`: every signature must verify over the manifest and
 * name its own key's pin (else `bad-signature`); at least `threshold` distinct pinned keys must
 * have signed (a signature of an unpinned key never counts: `unpinned-key` when it is all there
 * is, else `below-threshold`). Answers the pins that counted.
 */
export function verifyReleaseSignatures(
  manifest: ReleaseManifest,
  signatures: readonly ReleaseSignature[],
  trust: ReleaseTrust,
): string[] {
  if (trust.pins.length === 0 || trust.threshold < 1) {
    throw releaseRefused(
      'no-trust',
      'no release signers are pinned here: set the signer pins (BETTER_COMPUTE_RELEASE_PINS, or bcd’s release pins) before publishing or installing releases',
    );
  }
  const bytes = releaseSigningBytes(manifest);
  const pinned = new Set(trust.pins);
  const counted = new Set<string>();
  const unpinned: string[] = [];
  for (const s of signatures) {
    let pin: string;
    try {
      pin = releaseKeyPin(s.publicKey);
    } catch {
      throw releaseRefused('bad-signature', `signature of ${s.keyId}: its public key is not an Ed25519 key`);
    }
    if (pin !== s.keyId) {
      throw releaseRefused('bad-signature', `signature of ${s.keyId}: the public key given has pin ${pin}`);
    }
    const key = createPublicKey({ key: Buffer.from(s.publicKey, 'base64'), format: 'der', type: 'spki' });
    if (!verify(null, bytes, key, Buffer.from(s.signature, 'base64'))) {
      throw releaseRefused(
        'bad-signature',
        `the signature of ${s.keyId} does not verify over this manifest: sign the exact manifest again`,
      );
    }
    if (pinned.has(pin)) counted.add(pin);
    else unpinned.push(pin);
  }
  if (counted.size < trust.threshold) {
    if (unpinned.length > 0 && counted.size === 0) {
      throw releaseRefused(
        'unpinned-key',
        `signed only by keys that are not pinned here (${unpinned.join(', ')}): sign with a pinned key or pin the signer`,
      );
    }
    throw releaseRefused(
      'below-threshold',
      `signed by ${counted.size} distinct pinned key(s), ${trust.threshold} needed: collect more signatures`,
    );
  }
  return [...counted];
}

/** Refuses a release whose expiry is not after `nowMs`. */
export function checkReleaseNotExpired(manifest: ReleaseManifest, nowMs: number): void {
  if (Date.parse(manifest.expiresAt) <= nowMs) {
    throw releaseRefused(
      'expired',
      `release ${manifest.version} expired at ${manifest.expiresAt}: publish a newly signed release`,
    );
  }
}

/** Refuses a version that is not above `newest` (rollback protection on one channel). */
export function checkNotDowngrade(manifest: ReleaseManifest, newest: string | null, where: string): void {
  if (newest !== null && compareVersions(manifest.version, newest) <= 0) {
    throw releaseRefused(
      'downgrade',
      `release ${manifest.version} is not newer than ${newest}, ${where} on channel ${manifest.channel}: rollback protection refuses it (publish a higher version)`,
    );
  }
}

/**
 * Checks each file's bytes against the manifest: every listed file present, of its size and
 * SHA-256, and no file the manifest does not list. `digest-mismatch` names the first bad file.
 */
export function checkReleaseFiles(manifest: ReleaseManifest, files: ReadonlyMap<string, Buffer>): void {
  const paths = manifest.files.map((f) => f.path);
  const repeated = paths.find((p, i) => paths.indexOf(p) !== i);
  if (repeated) throw releaseRefused('digest-mismatch', `file ${repeated} is listed twice in the manifest`);
  for (const f of manifest.files) {
    const content = files.get(f.path);
    if (!content) throw releaseRefused('digest-mismatch', `file ${f.path} of the manifest is missing`);
    const digest = createHash('sha256').update(content).digest('hex');
    if (content.length !== f.size || digest !== f.sha256) {
      throw releaseRefused(
        'digest-mismatch',
        `file ${f.path} does not match the manifest (sha256 ${digest}, ${content.length} bytes; expected ${f.sha256}, ${f.size} bytes)`,
      );
    }
  }
  for (const path of files.keys()) {
    if (!manifest.files.some((f) => f.path === path)) {
      throw releaseRefused('digest-mismatch', `file ${path} is not in the manifest`);
    }
  }
}

/** The manifest entry of a file's bytes. */
export function releaseFileEntry(path: string, content: Buffer): ReleaseFile {
  return { path, size: content.length, sha256: createHash('sha256').update(content).digest('hex') };
}
