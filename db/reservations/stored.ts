import { z } from 'zod';
import { ComputeError } from '../../domain/errors.ts';
import {
  type HostResourceAmounts,
  type NormalizedRequest,
  storedRequestSchema,
} from '../../domain/reservation-request.ts';
import { hostResourcesSchema } from '../../domain/reservation-schema.ts';

/** `reservations.host_share`: the pool's per-GPU share the request books as a floor. */
const storedHostShareSchema = hostResourcesSchema.required() satisfies z.ZodType<HostResourceAmounts>;

function parseStored<T>(schema: z.ZodType<T>, value: unknown, what: string, reservationId: string): T {
  const parsed = schema.safeParse(value);
  if (parsed.success) return parsed.data;
  throw new ComputeError(
    'INTERNAL',
    `reservation ${reservationId}: its stored ${what} does not parse: ${z.prettifyError(parsed.error)}`,
  );
}

/**
 * The stored request of a reservation, parsed by its schema (domain/reservation-request.ts).
 * INTERNAL (naming the reservation) when it does not parse.
 */
export function parseStoredRequest(reservationId: string, value: unknown): NormalizedRequest {
  return parseStored(storedRequestSchema, value, 'request', reservationId);
}

/**
 * The stored host share of a reservation, parsed by its schema (none stored books no share).
 * INTERNAL (naming the reservation) when it does not parse.
 */
export function parseStoredHostShare(reservationId: string, value: unknown): HostResourceAmounts {
  if (value === null || value === undefined) return { vcpu: 0, memoryGiB: 0, hugepages1Gi: 0 };
  return parseStored(storedHostShareSchema, value, 'host share', reservationId);
}
