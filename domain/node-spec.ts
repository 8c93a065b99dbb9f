import { z } from 'zod';

/**
 * The NodeSpec: a node's generation-numbered desired state in sections. This project fills the
 * `devices` section (one assignment per allocation); other sections pass through untouched. The
 * generation is bumped only when the spec's canonical JSON changes.
 */

export const deviceAssignmentSchema = z.looseObject({
  allocationId: z.string().min(1).max(100),
  /** The booked devices' row ids. */
  deviceIds: z.array(z.string().min(1).max(100)).max(64),
  /** The same devices' stable ids on the node (GPU UUIDs), in the same order. */
  stableIds: z.array(z.string().min(1).max(200)).max(64),
  /** The booking's end, epoch milliseconds. */
  until: z.number().int().nonnegative(),
  binding: z.enum(['hold', 'kubernetes']).default('hold'),
  /** A spot preemption's notice deadline, epoch milliseconds: bcd tells the workload (a file and BCD_PREEMPT_AT). */
  preemptAt: z.number().int().nonnegative().optional(),
  limits: z
    .strictObject({
      cpuMillis: z.number().int().nonnegative().optional(),
      memoryBytes: z.number().int().nonnegative().optional(),
      hugepages1Gi: z.number().int().nonnegative().optional(),
      /** The cpuset: CPUs of the devices' NUMA nodes, never the host's reserved ones (domain/host-limits.ts). */
      cpus: z
        .string()
        .max(32 * 1024)
        .optional(),
      mems: z.string().max(1024).optional(),
    })
    .optional(),
  /** A time-slice or MPS pool's sharing settings, exported to the workload (domain/sharing.ts). */
  sharing: z
    .strictObject({
      mode: z.enum(['time-slice', 'mps']),
      replicas: z.number().int().min(1).max(64),
      mpsThreadPercentage: z.number().int().min(1).max(100).optional(),
    })
    .optional(),
});
export type DeviceAssignment = z.infer<typeof deviceAssignmentSchema>;

/** MIG profiles per GPU (by UUID), in creation order: the `mig-layout` config unit's settings. */
export const migLayoutSettingsSchema = z.strictObject({
  gpus: z
    .array(
      z.strictObject({
        uuid: z.string().regex(/^GPU-[A-Za-z0-9-]{1,200}$/),
        profiles: z.array(z.string().regex(/^[1-7]g\.\d{1,4}gb(\+me)?$/)).max(7),
      }),
    )
    .max(64),
});
export type MigLayoutSettings = z.infer<typeof migLayoutSettingsSchema>;

/** One concern of the host's configuration (glossary: Config unit). bcd converges `mig-layout`. */
export const configUnitSchema = z.discriminatedUnion('unit', [
  z.strictObject({ unit: z.literal('mig-layout'), settings: migLayoutSettingsSchema }),
]);
export type ConfigUnit = z.infer<typeof configUnitSchema>;

export const hostConfigSchema = z.looseObject({ units: z.array(configUnitSchema).max(32).default([]) });
export type HostConfig = z.infer<typeof hostConfigSchema>;

export const nodeSpecSchema = z.looseObject({
  devices: z.array(deviceAssignmentSchema).max(256).default([]),
  host: hostConfigSchema.optional(),
});
export type NodeSpec = z.infer<typeof nodeSpecSchema>;

/** JSON with object keys sorted at every level: equal specs are equal strings. */
export function canonicalJson(value: unknown): string {
  return JSON.stringify(sortKeys(value));
}

function sortKeys(value: unknown): unknown {
  if (Array.isArray(value)) return value.map(sortKeys);
  if (value && typeof value === 'object') {
    const out: Record<string, unknown> = {};
    for (const key of Object.keys(value).sort()) {
      const v = (value as Record<string, unknown>)[key];
      if (v !== undefined) out[key] = sortKeys(v);
    }
    return out;
  }
  return value;
}

/** Assignments in a canonical order (by allocation id). */
export function normalizeAssignments(assignments: readonly DeviceAssignment[]): DeviceAssignment[] {
  return [...assignments].sort((a, b) => a.allocationId.localeCompare(b.allocationId));
}

/** The top-level sections that differ between two specs, with their new values (a patch). */
export function specPatch(
  from: Record<string, unknown>,
  to: Record<string, unknown>,
): Record<string, unknown> {
  const patch: Record<string, unknown> = {};
  for (const key of new Set([...Object.keys(from), ...Object.keys(to)])) {
    if (canonicalJson(from[key]) !== canonicalJson(to[key])) patch[key] = to[key] ?? null;
  }
  return patch;
}

/** Applies a section patch: each named section is replaced; null removes it. */
export function applySpecPatch(
  spec: Record<string, unknown>,
  patch: Record<string, unknown>,
): Record<string, unknown> {
  const out: Record<string, unknown> = { ...spec };
  for (const [key, value] of Object.entries(patch)) {
    if (value === null) delete out[key];
    else out[key] = value;
  }
  return out;
}
