import { createHash } from 'node:crypto';
import { z } from 'zod';
import { canonicalJson } from './node-spec.ts';

/**
 * The JSON sections of `NodeInventory v1` carried in `InventorySection.data`. Each is hashed
 * (hex SHA-256 of its canonical JSON) so the daemon sends only what changed.
 */

export const gpuInventorySchema = z.strictObject({
  uuid: z.string().min(1).max(200),
  index: z.number().int().min(0).max(1023),
  model: z.string().min(1).max(200),
  memoryMiB: z.number().int().min(0).max(10_000_000),
  nvlinkDomain: z.string().max(200).nullable(),
  numaNode: z.number().int().min(-1).max(1023),
  pciBusId: z.string().max(64).optional(),
  health: z.enum(['healthy', 'unhealthy', 'unknown']),
});
export type GpuInventory = z.infer<typeof gpuInventorySchema>;

export const gpusSectionSchema = z.strictObject({ gpus: z.array(gpuInventorySchema).max(256) });
export type GpusSection = z.infer<typeof gpusSectionSchema>;

export const hostSectionSchema = z.strictObject({
  hostname: z.string().max(253),
  vcpu: z.number().int().min(0).max(65_536),
  memoryGiB: z.number().int().min(0).max(1_048_576),
  hugepages1Gi: z.number().int().min(0).max(1_048_576).default(0),
  /** GPUs seen on the PCI bus; a different count from the driver's raises GpuCountMismatch. */
  pciGpuCount: z.number().int().min(0).max(256),
  kernel: z.string().max(200).optional(),
});
export type HostSection = z.infer<typeof hostSectionSchema>;

export const inventorySections = { gpus: gpusSectionSchema, host: hostSectionSchema } as const;
export type InventorySectionName = keyof typeof inventorySections;

export function isInventorySectionName(name: string): name is InventorySectionName {
  return Object.hasOwn(inventorySections, name);
}

/** The hash of a section as both sides compute it. */
export function sectionHash(data: unknown): string {
  return createHash('sha256').update(canonicalJson(data)).digest('hex');
}
