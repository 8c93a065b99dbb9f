import { z } from 'zod';

/**
 * Deploy profiles: what a machine becomes. A profile version is immutable once a workflow has
 * expanded it (`used_at`); a change is a new version. Its steps are expanded for one machine into
 * the persisted steps of a provisioning workflow (domain/metal-steps.ts).
 */

/** Acceptance checks run after the deployed system rejoined, against what inspection promised. */
export const acceptanceChecks = ['gpus-present', 'gpus-healthy', 'inventory-reported'] as const;
export type AcceptanceCheck = (typeof acceptanceChecks)[number];

export const hostConfigUnitSchema = z.strictObject({
  /** A systemd unit or a file name written into the deployed system. */
  name: z.string().regex(/^[A-Za-z0-9@._-]{1,100}$/, 'a unit name such as gpu-setup.service'),
  content: z.string().max(16_384),
});

export const profileSpecSchema = z.strictObject({
  /** The image deployed (its id, img_…): verified, or a private image of the profile's tenant. */
  imageId: z.string().regex(/^img_[0-9a-z]{26}$/, 'an image id (img_…)'),
  /** cloud-init user data written for the first boot. */
  userData: z.string().max(65_536).optional(),
  hostConfig: z.array(hostConfigUnitSchema).max(32).default([]),
  acceptance: z.array(z.enum(acceptanceChecks)).max(8).default(['inventory-reported']),
  /** Per-step limits (defaults: domain/metal-steps.ts). */
  stepTimeoutSeconds: z.number().int().min(5).max(7_200).optional(),
  maxAttempts: z.number().int().min(1).max(10).default(3),
});
export type ProfileSpec = z.infer<typeof profileSpecSchema>;
