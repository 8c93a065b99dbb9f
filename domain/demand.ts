import { z } from 'zod';
import { figure } from './holds.ts';
import { tenantIdSchema } from './reservation-schema.ts';

/**
 * The unmet-demand ledger, the pure part: the closed set of reasons a request went unmet, how a
 * request's shape is written (so equal shapes count together), and the report's schemas.
 */

export const demandReasons = [
  // holds
  'no-kind',
  'not-accepting',
  'no-field',
  'no-room',
  // reservations
  'pending',
  'capacity',
  'quota',
  'failed-capacity',
] as const;
export type DemandReason = (typeof demandReasons)[number];

/** The end reasons of a reservation that failed for want of capacity (recorded as `failed-capacity`). */
export const capacityFailureReasons = ['max-pending-exceeded'] as const;

/** Whether a reservation that ended `failed` with this reason failed for want of capacity. */
export function isCapacityFailure(reason: string): boolean {
  return (capacityFailureReasons as readonly string[]).includes(reason);
}

/** `hold notebook: 2 cores, 4 GiB` (VRAM only when the kind declares some). */
export function holdShape(kind: { name: string; cpuCores: number; ramGiB: number; vramGiB: number }): string {
  return `hold ${kind.name}: ${figure(kind.cpuCores)} cores, ${figure(kind.ramGiB)} GiB${
    kind.vramGiB > 0 ? `, ${figure(kind.vramGiB)} GiB VRAM` : ''
  }`;
}

/** `hold notebook` for a kind the pool does not declare. */
export const undeclaredHoldShape = (kind: string) => `hold ${kind}: undeclared`;

/** `8 gpu nvlink-all + 32 vCPU, 256 GiB` from a stored request's devices and host resources. */
export function reservationShape(request: {
  devices: ReadonlyArray<{ class: string; count: number; topology?: string }>;
  resources?: { vcpu?: number | undefined; memoryGiB?: number | undefined } | undefined;
  gang?: { size?: number } | number | undefined;
}): string {
  const devices = request.devices
    .map((d) => `${d.count} ${d.class}${d.topology && d.topology !== 'any' ? ` ${d.topology}` : ''}`)
    .join(' + ');
  const host = [
    request.resources?.vcpu ? `${request.resources.vcpu} vCPU` : null,
    request.resources?.memoryGiB ? `${request.resources.memoryGiB} GiB` : null,
  ].filter(Boolean);
  return host.length > 0 ? `${devices} + ${host.join(', ')}` : devices;
}

export const demandInput = z.strictObject({
  tenantId: tenantIdSchema,
  /** Only this pool (id). */
  poolId: z.string().min(1).max(100).optional(),
  /** How far back the window reaches (default 7 days, at most 90). */
  windowSeconds: z
    .number()
    .int()
    .min(60)
    .max(90 * 86_400)
    .default(7 * 86_400),
  /** How many of the top unmet shapes to answer (default 10). */
  top: z.number().int().min(1).max(100).default(10),
});

const count = z.object({ key: z.string(), count: z.number() });

export const pendingWhySchema = z.object({
  reservationId: z.string(),
  tenantId: z.string(),
  poolId: z.string(),
  shape: z.string(),
  pendingSince: z.number().nullable(),
  /** 1 for the oldest pending reservation of its pool. */
  queuePosition: z.number(),
  queueLength: z.number(),
  /** Why the nodes do not take it, one entry per group of nodes with the same reason. */
  blocking: z.array(z.object({ reason: z.string(), nodes: z.number(), message: z.string() })),
  /** The placer's summary, e.g. `0 of 4 nodes fit: 4 lack 8 free GPUs`. */
  message: z.string(),
  /** The earliest start within 14 days at which it would fit, or null. */
  earliestStart: z.number().nullable(),
});

export const demandReportSchema = z.object({
  window: z.object({ start: z.number(), end: z.number() }),
  total: z.number(),
  byShape: z.array(count),
  byPool: z.array(count),
  byTenant: z.array(count),
  byReason: z.array(count),
  topShapes: z.array(
    z.object({ shape: z.string(), poolId: z.string().nullable(), count: z.number(), lastAt: z.number() }),
  ),
  pending: z.array(pendingWhySchema),
});
export type DemandReport = z.infer<typeof demandReportSchema>;
