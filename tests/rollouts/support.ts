import {
  generateReleaseSigningKey,
  type ReleaseManifest,
  type ReleaseSignature,
  releaseFileEntry,
  signRelease,
} from '../../domain/release-manifest.ts';
import { currentProtocolVersion } from '../../domain/release-version.ts';

export interface Signer {
  privateKeyPem: string;
  publicKeyPem: string;
  pin: string;
}

export const newSigner = (): Signer => generateReleaseSigningKey();

/** A simulated bcd "binary" of `version`: a file set (with a sim.json when it should misbehave). */
export function simulatedBinary(
  version: string,
  behaviour?: 'crash-at-start' | 'unhealthy',
): Map<string, Buffer> {
  const files = new Map<string, Buffer>([
    ['bin/bcd', Buffer.from(`#!/bin/sh\n# simulated bcd ${version}\n`)],
    ['share/bcd/VERSION', Buffer.from(`${version}\n`)],
  ]);
  if (behaviour) files.set('sim.json', Buffer.from(JSON.stringify({ behaviour })));
  return files;
}

/** A manifest of `files`, expiring in a day unless told. */
export function manifestOf(
  version: string,
  files: Map<string, Buffer>,
  overrides: Partial<ReleaseManifest> = {},
): ReleaseManifest {
  return {
    channel: 'stable',
    version,
    protocolVersion: currentProtocolVersion,
    minControlPlaneVersion: '0.1.0',
    files: [...files].map(([path, content]) => releaseFileEntry(path, content)),
    expiresAt: new Date(Date.now() + 86_400_000).toISOString(),
    ...overrides,
  };
}

/** The body of releases.publish for a manifest, its signers and its files. */
export function publishBody(
  manifest: ReleaseManifest,
  signers: Signer[],
  files: Map<string, Buffer>,
): {
  manifest: ReleaseManifest;
  signatures: ReleaseSignature[];
  files: Array<{ path: string; content: string }>;
} {
  return {
    manifest,
    signatures: signers.map((s) => signRelease(manifest, s.privateKeyPem)),
    files: [...files].map(([path, content]) => ({ path, content: content.toString('base64') })),
  };
}
