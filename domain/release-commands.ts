import { z } from 'zod';

/**
 * The payloads of the self-update command kinds. The manifest and signatures travel loosely typed
 * so that bcd, not the payload parser, refuses a bad release with its reason.
 */
export const bcdUpdatePayloadSchema = z.strictObject({
  releaseId: z.string().min(1).max(100),
  manifest: z.record(z.string(), z.unknown()),
  signatures: z.array(z.record(z.string(), z.unknown())).max(16),
  /** Each file's bytes, base64: the gateway is how bcd fetches them. */
  files: z.array(z.strictObject({ path: z.string().min(1).max(200), content: z.string() })).max(256),
  /** How long the new version must stay healthy before bcd commits it. */
  soakMs: z.number().int().min(0).max(86_400_000),
});
export type BcdUpdatePayload = z.infer<typeof bcdUpdatePayloadSchema>;

export const bcdRollbackPayloadSchema = z.strictObject({
  /** The version bcd should be back on (its previous slot must hold it). */
  toVersion: z.string().min(1).max(100).nullable().optional(),
  reason: z.string().max(500).optional(),
});
export type BcdRollbackPayload = z.infer<typeof bcdRollbackPayloadSchema>;

/** What bcd reports about an update, in `UpdateStatus.state`. */
export const bcdUpdateStates = ['healthy', 'unhealthy', 'rolled-back', 'committed'] as const;
export type BcdUpdateState = (typeof bcdUpdateStates)[number];
