import { z } from 'zod';
import { fetchUrlSchema } from './metal-bmc.ts';
import { imageFormats } from './metal-images.ts';
import { hostConfigUnitSchema } from './metal-profiles.ts';

/**
 * The commissioning command kinds a ramdisk runs (role `ramdisk` only), with their payloads.
 * `deploy.image` streams the image from its URL and fails on a digest other than the one the
 * image was registered with; it writes the first-boot configuration beside it: the deployed
 * system's single-use discovery token and the user data and host configuration of the profile.
 */
export const diskWipePayload = z.strictObject({ workflowId: z.string().max(100).optional() });

export const deployImagePayload = z.strictObject({
  workflowId: z.string().max(100),
  image: z.strictObject({
    id: z.string().max(100),
    name: z.string().max(100),
    version: z.string().max(100),
    format: z.enum(imageFormats),
    url: fetchUrlSchema,
    sha256: z.string().regex(/^[0-9a-f]{64}$/),
  }),
  firstBoot: z.strictObject({
    /** The deployed system's discovery token (single use; it joins with a proof by this ramdisk's key). */
    discoveryToken: z.string().max(200),
    userData: z.string().max(65_536).optional(),
    hostConfig: z.array(hostConfigUnitSchema).max(32).default([]),
  }),
});
export type DeployImagePayload = z.infer<typeof deployImagePayload>;

export const bootKexecPayload = z.strictObject({ workflowId: z.string().max(100).optional() });
export const logsCollectPayload = z.strictObject({ workflowId: z.string().max(100).optional() });
