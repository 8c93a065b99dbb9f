import { z } from 'zod';
import { insertAuditEvent } from '../db/events/audit.ts';
import { insertRelease, listReleases, type ReleaseView, requireRelease } from '../db/releases/releases.ts';
import {
  releaseManifestSchema,
  releaseRefused,
  releaseSignatureSchema,
  verifyReleaseSignatures,
} from '../domain/release-manifest.ts';
import {
  compareVersions,
  controlPlaneVersion,
  currentProtocolVersion,
  protocolSkew,
} from '../domain/release-version.ts';
import { requireRootAdmin } from './admin/guard.ts';
import { defineMethod } from './method.ts';

const releaseId = z.string().regex(/^rel_[0-9a-z]{26}$/, 'a release id (rel_…)');

const releaseOut = z.object({
  id: z.string(),
  channel: z.string(),
  version: z.string(),
  protocolVersion: z.number().int(),
  minControlPlaneVersion: z.string(),
  manifestDigest: z.string(),
  manifest: releaseManifestSchema,
  signerPins: z.array(z.string()),
  expiresAt: z.number(),
  publishedBy: z.string().nullable(),
  createdAt: z.number(),
});

function view(r: ReleaseView): z.input<typeof releaseOut> {
  return {
    id: r.id,
    channel: r.channel,
    version: r.version,
    protocolVersion: r.protocolVersion,
    minControlPlaneVersion: r.minControlPlaneVersion,
    manifestDigest: r.manifestDigest,
    manifest: r.manifest,
    signerPins: r.signerPins,
    expiresAt: r.expiresAt.getTime(),
    publishedBy: r.publishedBy,
    createdAt: r.createdAt.getTime(),
  };
}

const publish = defineMethod({
  summary:
    'Publish a signed bcd release: its manifest, k distinct signatures of pinned keys and its files (base64). Refused when a signature does not verify, a key is not pinned, a file does not match, it expired, or its version is not above the channel’s newest.',
  action: 'compute:admin:write',
  input: z.strictObject({
    manifest: releaseManifestSchema,
    signatures: z.array(releaseSignatureSchema).min(1).max(16),
    files: z
      .array(
        z.strictObject({
          path: z.string().min(1).max(200),
          content: z
            .string()
            .max(700_000)
            .regex(/^[A-Za-z0-9+/=]*$/, 'base64'),
        }),
      )
      .min(1)
      .max(256),
  }),
  output: releaseOut.extend({ created: z.boolean() }),
  handler: async (ctx, input) => {
    await requireRootAdmin(ctx, 'compute:admin:write');
    const { manifest } = input;
    if (compareVersions(manifest.minControlPlaneVersion, controlPlaneVersion) > 0) {
      throw releaseRefused(
        'control-plane-too-old',
        `release ${manifest.version} needs control plane ${manifest.minControlPlaneVersion} or later; this one is ${controlPlaneVersion}: upgrade the control plane first`,
      );
    }
    if (
      manifest.protocolVersion > currentProtocolVersion ||
      manifest.protocolVersion < currentProtocolVersion - protocolSkew
    ) {
      throw releaseRefused(
        'protocol-unsupported',
        `release ${manifest.version} speaks session protocol ${manifest.protocolVersion}; this control plane accepts ${currentProtocolVersion - protocolSkew} to ${currentProtocolVersion}`,
      );
    }
    const { config } = ctx.deps;
    const signerPins = verifyReleaseSignatures(manifest, input.signatures, {
      pins: config.BETTER_COMPUTE_RELEASE_PINS,
      threshold: config.BETTER_COMPUTE_RELEASE_THRESHOLD,
    });
    const files = new Map(input.files.map((f) => [f.path, Buffer.from(f.content, 'base64')]));
    const { release, created } = await insertRelease(ctx.deps.db, {
      manifest,
      signatures: input.signatures,
      signerPins,
      files,
      publishedBy: ctx.principal.identityId,
    });
    if (created) {
      await ctx.deps.db.transaction().execute((trx) =>
        insertAuditEvent(trx, {
          tenantId: ctx.principal.tenantId,
          actorIdentityId: ctx.principal.identityId,
          action: 'compute:admin:write',
          resourceType: 'compute-release',
          resourceId: release.id,
          requestId: ctx.requestId,
          context: { version: release.version, channel: release.channel, signerPins },
        }),
      );
    }
    return { ...view(release), created };
  },
});

const list = defineMethod({
  summary: 'Published releases, newest first.',
  action: 'compute:admin:read',
  input: z.strictObject({
    channel: z.string().max(32).optional(),
    limit: z.number().int().min(1).max(200).default(50),
  }),
  output: z.object({ releases: z.array(releaseOut) }),
  handler: async (ctx, input) => {
    await requireRootAdmin(ctx, 'compute:admin:read');
    const releases = await listReleases(ctx.deps.db, {
      limit: input.limit,
      ...(input.channel ? { channel: input.channel } : {}),
    });
    return { releases: releases.map(view) };
  },
});

const get = defineMethod({
  summary: 'One release: its manifest, signers and expiry.',
  action: 'compute:admin:read',
  input: z.strictObject({ releaseId }),
  output: releaseOut,
  handler: async (ctx, input) => {
    await requireRootAdmin(ctx, 'compute:admin:read');
    return view(await requireRelease(ctx.deps.db, input.releaseId));
  },
});

/** `releases.*`: signed bcd releases (root administrators only). */
export const releaseMethods = { publish, list, get };
