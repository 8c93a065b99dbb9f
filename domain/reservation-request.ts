import { createHash } from 'node:crypto';
import { z } from 'zod';
import { parseDuration } from './duration.ts';
import { ComputeError } from './errors.ts';
import {
  deviceRequestSchema,
  hostResourcesSchema,
  maxDurationMs,
  minDurationMs,
  type PreviewInput,
  reservationRequestShape,
} from './reservation-schema.ts';

export type DeviceClass = 'gpu' | 'gpu.mig' | 'gpu.slot';
export type Topology = 'any' | 'nvlink-all';

export interface HostResourceAmounts {
  vcpu: number;
  memoryGiB: number;
  hugepages1Gi: number;
}

/**
 * `reservations.request` as admission stores it (normalizeRequest's output, with the booked host
 * resources): the create input's own field schemas, with the duration in milliseconds and the
 * defaults (`binding`, `topology`) filled in. Every reader of a stored request parses it with this.
 */
export const storedRequestSchema = z.strictObject({
  poolId: reservationRequestShape.poolId,
  devices: z.array(deviceRequestSchema.required({ topology: true })).min(1),
  /** `'<ms>ms'`, as the reservation object shows it. */
  duration: z.string(),
  durationMs: z.number().int().positive(),
  binding: reservationRequestShape.binding.unwrap(),
  start: reservationRequestShape.start,
  resources: hostResourcesSchema.optional(),
  leaseSeconds: reservationRequestShape.leaseSeconds,
  projectId: reservationRequestShape.projectId,
  spot: reservationRequestShape.spot,
  gang: reservationRequestShape.gang,
  /** `binding: 'node'`: the profile deployed on each machine (its version pinned at admission). */
  node: reservationRequestShape.node,
});

/** The validated request as stored: durations in milliseconds, defaults filled in. */
export type NormalizedRequest = z.infer<typeof storedRequestSchema>;

/** How far ahead a calendar reservation may start when its pool's policy does not say (90 days). */
export const defaultStartHorizonDays = 90;
/** How far in the past a requested start may lie (clock skew, a slow client); it then starts now. */
export const startGraceMs = 5 * 60_000;

/**
 * Whether a requested start lies within the horizon at `now` (the control plane's clock): at most
 * the pool's `horizonDays` ahead (its policy `calendar.horizonDays`, default 90) and at most 5
 * minutes past. Answers the INVALID_INPUT to throw, naming the bound, or null when it is within.
 */
export function startOutOfHorizon(
  start: number,
  now: number,
  horizonDays: number = defaultStartHorizonDays,
): ComputeError | null {
  const aheadMs = horizonDays * 86_400_000;
  if (start >= now - startGraceMs && start <= now + aheadMs) return null;
  const at = (ms: number) => (Number.isFinite(new Date(ms).getTime()) ? new Date(ms).toISOString() : `${ms}`);
  return new ComputeError(
    'INVALID_INPUT',
    start < now
      ? `start: ${at(start)} is in the past; a start may lie at most 5 minutes before now (${at(now)}): leave start out to start now`
      : `start: ${at(start)} is too far ahead; in this pool a reservation may start at most ${horizonDays} days from now (${at(now)}, latest ${at(now + aheadMs)}; pool policy calendar.horizonDays)`,
    { field: 'start', now, earliest: now - startGraceMs, latest: now + aheadMs, horizonDays },
  );
}

/**
 * Normalizes a create (or preview) input: the duration in milliseconds within its bounds, `binding`
 * defaulting to `hold`, `topology` to `any`. `'2h'` and `7200000` normalize to the same request.
 * INVALID_INPUT names the field; UNSUPPORTED for what this version does not serve.
 */
export function normalizeRequest(input: PreviewInput): NormalizedRequest {
  if (input.spot && input.binding === 'node') {
    throw new ComputeError(
      'INVALID_INPUT',
      "spot: a binding: 'node' lease cannot be spot (a preempted machine cannot be taken back at a notice); leave spot out or book a hold",
    );
  }
  if (input.binding === 'instance') {
    throw new ComputeError(
      'UNSUPPORTED',
      "binding: 'instance' (a VPS instance) is not offered by this control plane; use binding 'hold' (the default), 'kubernetes' or 'node'",
    );
  }
  if (input.node && input.binding !== 'node') {
    throw new ComputeError('INVALID_INPUT', "node: only a binding: 'node' reservation takes node");
  }
  if (input.binding === 'node' && !input.node) {
    throw new ComputeError(
      'INVALID_INPUT',
      "node: a binding: 'node' lease names the profile to deploy on its machines: node: { profileId, profileVersion? }",
    );
  }
  if (input.binding === 'node' && (input.gang || input.devices[0]?.class !== 'gpu')) {
    throw new ComputeError(
      'INVALID_INPUT',
      "devices: a binding: 'node' lease books whole machines: devices: [{ class: 'gpu', count: <machines> }], without gang",
    );
  }
  const durationMs = parseDuration(input.duration, 'duration');
  if (durationMs < minDurationMs || durationMs > maxDurationMs) {
    throw new ComputeError('INVALID_INPUT', `duration: must be between 1m and 90d, got ${durationMs}ms`);
  }
  const resources = input.resources
    ? Object.fromEntries(Object.entries(input.resources).filter(([, v]) => v !== undefined))
    : undefined;
  return {
    poolId: input.poolId,
    devices: input.devices.map((d) => ({
      class: d.class,
      count: d.count,
      topology: d.topology ?? 'any',
      ...(d.selector ? { selector: d.selector } : {}),
    })),
    duration: `${durationMs}ms`,
    durationMs,
    binding: input.binding ?? 'hold',
    ...(input.start !== undefined ? { start: input.start } : {}),
    ...(resources ? { resources } : {}),
    ...(input.leaseSeconds !== undefined ? { leaseSeconds: input.leaseSeconds } : {}),
    ...(input.projectId !== undefined ? { projectId: input.projectId } : {}),
    ...(input.spot ? { spot: true } : {}),
    ...(input.gang
      ? {
          gang: {
            size: input.gang.size,
            ...(input.gang.topologyKey !== undefined ? { topologyKey: input.gang.topologyKey } : {}),
          },
        }
      : {}),
    ...(input.node
      ? {
          node: {
            profileId: input.node.profileId,
            ...(input.node.profileVersion !== undefined ? { profileVersion: input.node.profileVersion } : {}),
          },
        }
      : {}),
  };
}

function canonical(value: unknown): string {
  if (Array.isArray(value)) return `[${value.map(canonical).join(',')}]`;
  if (value && typeof value === 'object') {
    const entries = Object.entries(value as Record<string, unknown>)
      .filter(([, v]) => v !== undefined)
      .sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0));
    return `{${entries.map(([k, v]) => `${JSON.stringify(k)}:${canonical(v)}`).join(',')}}`;
  }
  return JSON.stringify(value);
}

/**
 * The stored request hash: SHA-256 of the canonical JSON of the tenant and the normalized request
 * (so without `wait` and `idempotencyKey`). Equal requests hash equal whatever their key order.
 */
export function requestHash(tenantId: string, request: NormalizedRequest): string {
  return createHash('sha256').update(canonical({ tenantId, request })).digest('hex');
}

/**
 * The hash of one extend request (the reservation, and its `until` or its `by` in milliseconds):
 * what an extend's idempotency key is bound to, and what a delegated approval of it approves.
 */
export function extendRequestHash(input: {
  tenantId: string;
  reservationId: string;
  until?: number | undefined;
  byMs?: number | undefined;
}): string {
  const request = {
    action: 'extend',
    reservationId: input.reservationId,
    ...(input.until !== undefined ? { until: input.until } : { byMs: input.byMs }),
  };
  return createHash('sha256')
    .update(canonical({ tenantId: input.tenantId, request }))
    .digest('hex');
}

/** The attributes IAM decides on (the seed's table), for one reservation. */
export function authzAttributes(input: {
  request: NormalizedRequest;
  gpuModel: string;
  region: string;
  resources: HostResourceAmounts;
  durationMs?: number;
}): Record<string, unknown> {
  const gang = input.request.gang?.size ?? 1;
  const whole = input.request.devices.filter((d) => d.class === 'gpu').reduce((n, d) => n + d.count, 0);
  const slices = input.request.devices.filter((d) => d.class !== 'gpu').reduce((n, d) => n + d.count, 0);
  const durationMs = input.durationMs ?? input.request.durationMs;
  return {
    gpuModel: input.gpuModel || 'other',
    gpuCount: whole * gang,
    gpuSlices: slices * gang,
    gangSize: gang,
    durationHours: Math.round((durationMs / 3_600_000) * 1000) / 1000,
    region: input.region,
    binding: input.request.binding,
    spot: input.request.spot ?? false,
    renewable: input.request.leaseSeconds !== undefined,
    projectId: input.request.projectId ?? null,
    vcpu: input.resources.vcpu * gang,
    memoryGiB: (input.resources.memoryGiB + input.resources.hugepages1Gi) * gang,
  };
}
