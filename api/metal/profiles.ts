import { z } from 'zod';
import { findImage, imageUsableBy } from '../../db/metal/images.ts';
import {
  findProfile,
  insertProfileVersion,
  listProfiles,
  type ProfileView,
} from '../../db/metal/profiles.ts';
import { ComputeError } from '../../domain/errors.ts';
import { acceptanceChecks, profileSpecSchema } from '../../domain/metal-profiles.ts';
import { defineMethod, type MethodContext } from '../method.ts';
import { requireCatalogTenant } from './catalog-access.ts';

const tenantId = z.string().min(1).max(100);
const profileId = z.string().regex(/^prof_[0-9a-z]{26}$/, 'a profile id (prof_…)');

export const profileOut = z.object({
  id: z.string(),
  version: z.number().int(),
  tenantId: z.string(),
  name: z.string(),
  imageId: z.string().nullable(),
  spec: z.object({
    imageId: z.string(),
    userData: z.string().optional(),
    hostConfig: z.array(z.object({ name: z.string(), content: z.string() })),
    acceptance: z.array(z.enum(acceptanceChecks)),
    stepTimeoutSeconds: z.number().int().optional(),
    maxAttempts: z.number().int(),
  }),
  usedAt: z.number().nullable(),
  immutable: z.boolean(),
  createdAt: z.number(),
});

function profileView(p: ProfileView): z.infer<typeof profileOut> {
  return {
    ...p,
    usedAt: p.usedAt?.getTime() ?? null,
    immutable: p.usedAt !== null,
    createdAt: p.createdAt.getTime(),
  };
}

/** A profile the caller may see (its tenant's, or any for the platform's administrators). */
export async function requireProfile(
  ctx: MethodContext,
  input: { profileId: string; version?: number | undefined },
  action: 'compute:profiles:read' | 'compute:profiles:manage',
): Promise<ProfileView> {
  const profile = await findProfile(ctx.deps.db, input);
  if (!profile || (!ctx.principal.rootAdmin && profile.tenantId !== ctx.principal.tenantId)) {
    throw new ComputeError(
      'NOT_FOUND',
      `profile ${input.profileId}${input.version ? ` version ${input.version}` : ''} not found`,
    );
  }
  await requireCatalogTenant(ctx, profile.tenantId, action);
  return profile;
}

const create = defineMethod({
  summary:
    'Write a new version of a deploy profile (version 1 for a new name): the image, user data, host configuration units, acceptance checks and step limits. Versions are never changed; a version a workflow used is immutable.',
  action: 'compute:profiles:manage',
  input: z.strictObject({
    tenantId: tenantId.optional(),
    name: z.string().regex(/^[a-z0-9][a-z0-9.-]{0,62}$/, "a name: lower-case letters, digits, '.' or '-'"),
    spec: profileSpecSchema,
  }),
  output: profileOut,
  handler: async (ctx, input) => {
    const owner = await requireCatalogTenant(ctx, input.tenantId, 'compute:profiles:manage');
    const image = await findImage(ctx.deps.db, input.spec.imageId);
    if (!image || !imageUsableBy(image, owner)) {
      throw new ComputeError(
        'NOT_FOUND',
        `spec.imageId: image ${input.spec.imageId} not found (a profile uses a verified image or one of its tenant)`,
      );
    }
    const profile = await ctx.deps.db
      .transaction()
      .execute((trx) => insertProfileVersion(trx, { tenantId: owner, name: input.name, spec: input.spec }));
    return profileView(profile);
  },
});

const list = defineMethod({
  summary: 'The deploy profiles of the caller’s tenant, every version.',
  action: 'compute:profiles:read',
  input: z.strictObject({ tenantId: tenantId.optional() }),
  output: z.object({ profiles: z.array(profileOut) }),
  handler: async (ctx, input) => {
    const tenant = await requireCatalogTenant(ctx, input.tenantId, 'compute:profiles:read');
    const all = ctx.principal.rootAdmin && input.tenantId === undefined;
    return {
      profiles: (await listProfiles(ctx.deps.db, { tenantId: all ? null : tenant })).map(profileView),
    };
  },
});

const get = defineMethod({
  summary: 'One version of a profile (the latest without `version`).',
  action: 'compute:profiles:read',
  input: z.strictObject({ profileId, version: z.number().int().min(1).optional() }),
  output: profileOut,
  handler: async (ctx, input) => profileView(await requireProfile(ctx, input, 'compute:profiles:read')),
});

/** `profiles.*`: versioned deploy profiles. */
export const profileMethods = { create, list, get };
