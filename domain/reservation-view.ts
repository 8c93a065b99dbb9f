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
      /** Preempted/SpotPreempted: when the spot reservation is released (epoch ms), and by which reservation. */
      deadline: z.number().optional(),
      preemptedBy: z.string().optional(),
    }),
  ),
  allocations: z.array(
    z.object({
      id: z.string(),
      nodeId: z.string(),
      state: z.string(),
      deviceIds: z.array(z.string()),
      /** The node's name, and for a gang the member's number (0..size-1). */
      nodeName: z.string().optional(),
      gangIndex: z.number().optional(),
    }),
  ),
  /** A gang: its size, topology key and the value its members share; null for one node. */
  gang: z
    .object({ size: z.number(), topologyKey: z.string().nullable(), topologyValue: z.string().nullable() })
    .nullable()
    .optional(),
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
  /**
   * BookingRepairs of a calendar reservation that moved members or found no place for them, oldest
   * first: each move from node to node with the reason, or the bad members and the placer's summary.
   */
  repairs: z.array(
    z.object({
      at: z.number(),
      moment: z.enum(['pre-start', 'start']),
      outcome: z.enum(['repaired', 'failed']),
      moves: z.array(
        z.object({
          gangIndex: z.number(),
          reason: z.string(),
          fromAllocationId: z.string(),
          fromNodeId: z.string(),
          fromNodeName: z.string(),
          fromDeviceIds: z.array(z.string()),
          toAllocationId: z.string(),
          toNodeId: z.string(),
          toNodeName: z.string(),
          toDeviceIds: z.array(z.string()),
        }),
      ),
      bad: z.array(z.object({ allocationId: z.string(), nodeId: z.string(), reason: z.string() })),
      message: z.string().nullable(),
      workflowId: z.string().nullable(),
    }),
  ),
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
