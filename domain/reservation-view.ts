import { z } from 'zod';
import type { ErrorCode } from './errors.ts';
import { type Condition, operationState } from './reservation-lifecycle.ts';
import type { ReservationState } from './reservation-states.ts';

/** The reservation object the API answers (the seed's "The reservation object"). */
export const reservationViewSchema = z.object({
  id: z.string(),
  tenantId: z.string(),
  poolId: z.string(),
  state: z.string(),
  request: z.record(z.string(), z.unknown()),
  during: z.object({ start: z.number(), end: z.number() }).nullable(),
  ownerIdentityId: z.string(),
  idempotencyKey: z.string(),
  projectId: z.string().nullable(),
  conditions: z.array(
    z.object({
      type: z.string(),
      reason: z.string(),
      message: z.string(),
      since: z.number().optional(),
      earliestStart: z.number().optional(),
    }),
  ),
  allocations: z.array(
    z.object({ id: z.string(), nodeId: z.string(), state: z.string(), deviceIds: z.array(z.string()) }),
  ),
  binding: z.record(z.string(), z.unknown()).nullable(),
  lease: z.object({ seconds: z.number(), expiresAt: z.number().nullable() }).nullable(),
  hostShare: z.record(z.string(), z.number()).nullable(),
  endReason: z.string().nullable(),
  operation: z.object({
    id: z.string(),
    state: z.enum(['running', 'pending', 'succeeded', 'failed']),
    error: z.object({ code: z.string(), message: z.string() }).optional(),
  }),
  version: z.number(),
  createdAt: z.number(),
  updatedAt: z.number(),
});

export type ReservationView = z.infer<typeof reservationViewSchema>;

const failureCodes: Partial<Record<ReservationState, ErrorCode>> = {
  failed: 'CAPACITY_UNAVAILABLE',
  denied: 'ACCESS_DENIED',
  cancelled: 'INVALID_STATE',
  expired: 'INVALID_STATE',
};

/** The reservation's operation: what a `wait` waits on, with the error of a failed one. */
export function operationOf(
  id: string,
  state: ReservationState,
  conditions: Condition[],
  endReason: string | null,
) {
  const opState = operationState(state, conditions);
  if (opState !== 'failed') return { id, state: opState };
  const reason = conditions.find((c) => c.type === 'Unschedulable')?.message ?? endReason ?? state;
  return {
    id,
    state: opState,
    error: { code: failureCodes[state] ?? 'INVALID_STATE', message: `reservation ${state}: ${reason}` },
  };
}
