/**
 * The types of the reservation lifecycle's pure transitions: timers, the snapshot the workflow
 * reads from PostgreSQL, what it was asked (intents), what it remembers, and the actions. The states
 * themselves are `reservation-states.ts`.
 */

import type { RepairMoment } from './booking-repair.ts';
import type { ReservationState, TerminalState } from './reservation-states.ts';

/** Every moment the lifecycle owns, in milliseconds. Pool policy `timers` and workflow input override. */
export interface LifecycleTimers {
  /** How long a node has to report every allocation bound (5 minutes). */
  bindTimeoutMs: number;
  /** How often a pending reservation tries to place again (30 seconds). */
  pendingRetryMs: number;
  /** How long a reservation may stay pending before it fails (the pool's `maxPending`, 24 hours). */
  maxPendingMs: number;
  /** The look taken before a future start (15 minutes before it). */
  preStartMs: number;
  /** The longest the workflow sleeps without a reason (15 minutes). */
  recheckMs: number;
  /** How many binding failures end the reservation (3: placed again at most twice). */
  maxBindFailures: number;
  /** The billing window (an hour). */
  usageWindowMs: number;
}

export const defaultTimers: LifecycleTimers = {
  bindTimeoutMs: 5 * 60_000,
  pendingRetryMs: 30_000,
  maxPendingMs: 24 * 3_600_000,
  preStartMs: 15 * 60_000,
  recheckMs: 15 * 60_000,
  maxBindFailures: 3,
  usageWindowMs: 3_600_000,
};

export interface Condition {
  type: string;
  reason: string;
  message: string;
  since?: number;
}

export interface AllocationView {
  id: string;
  nodeId: string;
  state: 'planned' | 'binding' | 'bound' | 'releasing' | 'released' | 'failed';
  boundAt: number | null;
  /** The allocation's end (its booking's), epoch ms. */
  until?: number;
  /** The upper bound of its device bookings, epoch ms (past `until` while a held release is carried). */
  bookedUntil?: number;
  /** The `until` of its node's NodeSpec assignment, or null when the node has none. */
  assignedUntil?: number | null;
  /** A later report of this bound allocation failed verification: its binding is not trusted. */
  bindingLost?: boolean;
  /** The node is not connected (its session ended or its lease ran out). */
  nodeUnreachable?: boolean;
  /** The node reports something besides bcd can hand its GPUs to pods. */
  foreignGpuExposure?: boolean;
  /** Booked atoms that are unhealthy (stable ids). */
  unhealthyAtoms?: string[];
  /** Its member number in a gang (0..size-1). */
  gangIndex?: number;
  /** How often this gang member was re-placed on its own. */
  memberAttempt?: number;
}

/** What PostgreSQL says about one reservation, all times epoch milliseconds of compute_now(). */
export interface ReservationSnapshot {
  id: string;
  tenantId: string;
  poolId: string;
  state: ReservationState;
  version: number;
  now: number;
  start: number | null;
  end: number | null;
  leaseSeconds: number | null;
  leaseExpiresAt: number | null;
  bindAttempts: number;
  bindDeadline: number | null;
  pendingSince: number | null;
  confirmationExpiresAt: number | null;
  endReason: string | null;
  conditions: Condition[];
  /** The current placement's allocations (not those released by an earlier attempt). */
  allocations: AllocationView[];
  /** False once the pool is archived or no longer offered to the tenant. */
  poolAvailable: boolean;
  timers: LifecycleTimers;
  /** What the reservation is, for the workflow's memo. */
  summary: string;
  /** A gang's size (absent or 1: one node). */
  gangSize?: number;
  /** A spot reservation under a preemption notice: when it is released (epoch ms). */
  preemptAt?: number;
  /** Booked ahead of a future start (a calendar reservation): BookingRepair checks it before. */
  calendar?: boolean;
  /** A dedicated-root lease (`binding: 'node'`): its deploy and clean workflows still running. */
  machineWorkflowIds?: string[];
}

/** What the workflow was asked since it last acted (signals and updates set these). */
export interface LifecycleIntents {
  release: boolean;
  cancel: boolean;
  confirmation: 'approved' | 'denied' | null;
  /** Capacity was freed in the pool: try placing now rather than at the next retry. */
  capacityFreed: boolean;
}

/** What the workflow remembers between looks (carried across continue-as-new). */
export interface LifecycleMemory {
  /** compute_now() of the last placement attempt of a pending reservation. */
  lastPlaceAttemptAt: number | null;
  /** compute_now() up to which usage has been metered. */
  meteredThrough: number | null;
  /** The BookingRepair moments already run (a calendar reservation's). */
  repairsDone?: RepairMoment[];
}

export type LifecycleAction =
  | { kind: 'finish' }
  | { kind: 'wait'; until: number; reason: string }
  | { kind: 'place' }
  | { kind: 'beginBinding'; bindDeadline: number }
  | { kind: 'activate' }
  | { kind: 'rebind'; reason: 'NodeDidNotBind' | 'NodeRejectedBinding'; message: string }
  | { kind: 'end'; state: TerminalState; reason: string; condition?: Condition }
  | { kind: 'setConditions'; conditions: Condition[] }
  | { kind: 'syncAssignments' }
  | {
      kind: 'replaceGangMembers';
      /** The members (allocation ids) that did not bind, each re-placed on its own. */
      allocationIds: string[];
      reason: 'NodeDidNotBind' | 'NodeRejectedBinding';
      bindDeadline: number;
    }
  | { kind: 'repairBookings'; moment: RepairMoment }
  /** A `kubernetes` release still held by pods: move its bookings' upper bound to `until` (unbilled). */
  | { kind: 'carryRelease'; until: number }
  /** A `kubernetes` release ends: the node reported the GPUs free, or it is forced (domain/kubernetes-release.ts). */
  | { kind: 'finishRelease'; forced: 'carry-limit' | 'carry-refused' | null }
  | { kind: 'meterUsage' };
