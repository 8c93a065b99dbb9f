import { createHash } from 'node:crypto';
import { z } from 'zod';
import { canonicalJson } from './node-spec.ts';

/**
 * The JSON sections of `NodeInventory v1` carried in `InventorySection.data`. Each is hashed
 * (hex SHA-256 of its canonical JSON) so the daemon sends only what changed.
 */

/** One MIG instance of a GPU in MIG mode, as nvidia-smi lists it. */
export const migInstanceSchema = z.strictObject({
  uuid: z.string().regex(/^MIG-[A-Za-z0-9/-]{1,200}$/),
  /** `1g.10gb`, `3g.40gb`, ... */
  profile: z.string().regex(/^[1-7]g\.\d{1,4}gb(\+me)?$/),
  gpuInstanceId: z.number().int().min(0).max(64),
  computeInstanceId: z.number().int().min(0).max(64),
  memoryMiB: z.number().int().min(0).max(10_000_000),
});
export type MigInstance = z.infer<typeof migInstanceSchema>;

export const gpuInventorySchema = z.strictObject({
  uuid: z.string().min(1).max(200),
  index: z.number().int().min(0).max(1023),
  model: z.string().min(1).max(200),
  memoryMiB: z.number().int().min(0).max(10_000_000),
  nvlinkDomain: z.string().max(200).nullable(),
  numaNode: z.number().int().min(-1).max(1023),
  pciBusId: z.string().max(64).optional(),
  health: z.enum(['healthy', 'unhealthy', 'unknown']),
  /** MIG mode and instances; absent on a GPU without MIG support. */
  mig: z
    .strictObject({
      mode: z.enum(['enabled', 'disabled']),
      instances: z.array(migInstanceSchema).max(7),
    })
    .optional(),
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
  /** NUMA nodes with their cpulists and memory (cpusets are cut from them). */
  numa: z
    .array(
      z.strictObject({
        node: z.number().int().min(0).max(1023),
        cpus: z.string().max(32 * 1024),
        memoryGiB: z.number().int().min(0).max(1_048_576),
      }),
    )
    .max(64)
    .optional(),
  /** The kernel's isolated CPUs (`isolcpus`), never part of the host reserve. */
  isolatedCpus: z
    .string()
    .max(32 * 1024)
    .optional(),
  /** The cgroup hierarchy bcd enforces holds with: `v2`, `v2-systemd`, `v1`, or `none`. */
  cgroup: z.enum(['v2', 'v2-systemd', 'v1', 'none']).optional(),
  /**
   * Resource names besides bcd's through which the node's kubelet can hand its GPUs to pods
   * (another device plugin registered, e.g. `nvidia.com/gpu`): the node condition ForeignGpuExposure.
   */
  foreignGpuResources: z.array(z.string().min(1).max(253)).max(64).optional(),
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
