import { z } from 'zod';
import { findImage, type ImageView, imageUsableBy, insertImage, listImages } from '../../db/metal/images.ts';
import { ComputeError } from '../../domain/errors.ts';
import { fetchUrlSchema } from '../../domain/metal-bmc.ts';
import {
  checkImageSignature,
  imageFormats,
  imageNameSchema,
  imageSignatureSchema,
  imageVersionSchema,
  sha256Schema,
} from '../../domain/metal-images.ts';
import { defineMethod } from '../method.ts';
import { requireCatalogTenant } from './catalog-access.ts';

const tenantId = z.string().min(1).max(100);

export const imageOut = z.object({
  id: z.string(),
  tenantId: z.string(),
  name: z.string(),
  version: z.string(),
  format: z.enum(imageFormats),
  sha256: z.string(),
  url: z.string(),
  sizeBytes: z.number().nullable(),
  signed: z.boolean(),
  signerPin: z.string().nullable(),
  verified: z.boolean(),
  visibility: z.enum(['public', 'private']),
  createdAt: z.number(),
});

export function imageView(image: ImageView): z.infer<typeof imageOut> {
  return { ...image, createdAt: image.createdAt.getTime() };
}

const register = defineMethod({
  summary:
    'Register an image (name@version, format, SHA-256 of its bytes, the URL a deploy streams it from). Verified, and usable by every tenant, only when its signature checks against the deployment’s image signer pins; otherwise private to its tenant. Idempotent for the same bytes; CONFLICT for other bytes under a name@version.',
  action: 'compute:images:manage',
  input: z.strictObject({
    tenantId: tenantId.optional(),
    name: imageNameSchema,
    version: imageVersionSchema,
    format: z.enum(imageFormats),
    sha256: sha256Schema,
    url: fetchUrlSchema,
    sizeBytes: z.number().int().min(0).optional(),
    signature: imageSignatureSchema.optional(),
  }),
  output: imageOut,
  handler: async (ctx, input) => {
    const owner = await requireCatalogTenant(ctx, input.tenantId, 'compute:images:manage');
    const checked = input.signature
      ? checkImageSignature(input, input.signature, ctx.deps.config.BETTER_COMPUTE_IMAGE_SIGNER_PINS)
      : null;
    const { image } = await ctx.deps.db.transaction().execute((trx) =>
      insertImage(trx, {
        tenantId: owner,
        name: input.name,
        version: input.version,
        format: input.format,
        sha256: input.sha256,
        url: input.url,
        sizeBytes: input.sizeBytes ?? null,
        signature: input.signature ? JSON.stringify(input.signature) : null,
        signerPin: checked?.pin ?? null,
        verified: checked?.verified ?? false,
      }),
    );
    return imageView(image);
  },
});

const list = defineMethod({
  summary: 'The images the caller may deploy: its tenant’s own and every verified one.',
  action: 'compute:images:read',
  input: z.strictObject({ tenantId: tenantId.optional() }),
  output: z.object({ images: z.array(imageOut) }),
  handler: async (ctx, input) => {
    const tenant = await requireCatalogTenant(ctx, input.tenantId, 'compute:images:read');
    const all = ctx.principal.rootAdmin && input.tenantId === undefined;
    return { images: (await listImages(ctx.deps.db, { tenantId: all ? null : tenant })).map(imageView) };
  },
});

const get = defineMethod({
  summary: 'One image (a private image of another tenant is NOT_FOUND).',
  action: 'compute:images:read',
  input: z.strictObject({ imageId: z.string().regex(/^img_[0-9a-z]{26}$/, 'an image id (img_…)') }),
  output: imageOut,
  handler: async (ctx, input) => {
    const tenant = await requireCatalogTenant(ctx, undefined, 'compute:images:read');
    const image = await findImage(ctx.deps.db, input.imageId);
    if (!image || (!ctx.principal.rootAdmin && !imageUsableBy(image, tenant))) {
      throw new ComputeError('NOT_FOUND', `image ${input.imageId} not found`);
    }
    return imageView(image);
  },
});

/** `images.*`: signed, content-addressed images for bare-metal deploys. */
export const imageMethods = { register, list, get };
