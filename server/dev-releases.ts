import { createPrivateKey, createPublicKey } from 'node:crypto';
import { existsSync, mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { sql } from 'kysely';
import type { Logger } from '../core/logger.ts';
import {
  generateReleaseSigningKey,
  type ReleaseManifest,
  releaseFileEntry,
  releaseKeyPin,
  releaseManifestSchema,
  signRelease,
} from '../domain/release-manifest.ts';
import { currentProtocolVersion } from '../domain/release-version.ts';
import type { ControlPlane } from './serve.ts';

/** The version the dev fleet runs, and the newer signed one ready to roll out. */
export const devReleaseVersions = { current: '0.1.0', next: '0.2.0' } as const;

/**
 * The dev stack's release signer: an Ed25519 key in `<dataDir>/release-signer.key`, made on first
 * run (the control plane and the simulated nodes pin it).
 */
export function devReleaseSigner(dataDir: string): { keyFile: string; privateKeyPem: string; pin: string } {
  const keyFile = path.join(dataDir, 'release-signer.key');
  if (!existsSync(keyFile))
    writeFileSync(keyFile, generateReleaseSigningKey().privateKeyPem, { mode: 0o600 });
  const privateKeyPem = readFileSync(keyFile, 'utf8');
  const publicKeyPem = createPublicKey(createPrivateKey(privateKeyPem))
    .export({ format: 'pem', type: 'spki' })
    .toString();
  return { keyFile, privateKeyPem, pin: releaseKeyPin(publicKeyPem) };
}

/** A simulated bcd "binary" of `version` in `<dataDir>/releases/<version>/`, with its manifest (kept across runs). */
function devRelease(
  dataDir: string,
  version: string,
): { dir: string; manifest: ReleaseManifest; files: Map<string, Buffer> } {
  const dir = path.join(dataDir, 'releases', version);
  const files = new Map<string, Buffer>([
    ['bin/bcd', Buffer.from(`#!/bin/sh\n# simulated bcd ${version}\n`)],
    ['share/bcd/VERSION', Buffer.from(`${version}\n`)],
  ]);
  for (const [name, content] of files) {
    mkdirSync(path.dirname(path.join(dir, 'files', name)), { recursive: true });
    writeFileSync(path.join(dir, 'files', name), content);
  }
  const manifestFile = path.join(dir, 'manifest.json');
  if (existsSync(manifestFile)) {
    const stored = releaseManifestSchema.safeParse(JSON.parse(readFileSync(manifestFile, 'utf8')));
    if (stored.success && Date.parse(stored.data.expiresAt) > Date.now() + 86_400_000) {
      return { dir, manifest: stored.data, files };
    }
  }
  const manifest: ReleaseManifest = {
    channel: 'stable',
    version,
    protocolVersion: currentProtocolVersion,
    minControlPlaneVersion: '0.1.0',
    files: [...files].map(([name, content]) => releaseFileEntry(name, content)),
    expiresAt: new Date(Date.now() + 90 * 86_400_000).toISOString(),
  };
  writeFileSync(manifestFile, `${JSON.stringify(manifest, null, 2)}\n`);
  return { dir, manifest, files };
}

/**
 * Publishes the dev fleet's release and the newer one (signed with the dev signer; publishing again
 * finds them), and gives the demo pool a short soak so a rollout of the demo fleet takes minutes.
 */
export async function seedDevReleases(input: {
  plane: ControlPlane;
  dataDir: string;
  rootToken: string;
  poolId: string;
  signer: { privateKeyPem: string };
  log: Logger;
}): Promise<Array<{ id: string; version: string; current: boolean }>> {
  await sql`UPDATE pools SET policy = policy || ${JSON.stringify({
    disruption: { maxUnavailable: '25%', soakSeconds: 15, gateTimeoutSeconds: 60 },
  })}::jsonb WHERE id = ${input.poolId} AND NOT policy ? 'disruption'`.execute(input.plane.deps.db);
  const out: Array<{ id: string; version: string; current: boolean }> = [];
  for (const [which, version] of Object.entries(devReleaseVersions)) {
    const release = devRelease(input.dataDir, version);
    const signature = signRelease(release.manifest, input.signer.privateKeyPem);
    try {
      const published = await input.plane.compute.api.releases.publish(
        { token: input.rootToken },
        {
          manifest: release.manifest,
          signatures: [signature],
          files: [...release.files].map(([p, content]) => ({ path: p, content: content.toString('base64') })),
        },
      );
      out.push({ id: published.id, version, current: which === 'current' });
    } catch (error) {
      input.log.warn({ err: error, version }, 'dev release not published');
    }
  }
  return out;
}
