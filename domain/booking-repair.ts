/**
 * BookingRepair's pure part: when a calendar reservation's bookings are checked (15 minutes
 * before its start, and again at the start), which booked members are bad and why, and the id of
 * the one workflow that runs each repair. No I/O: db/reservations/repair.ts reads and re-books.
 */

/** The two moments a calendar reservation's bookings are checked. */
export const repairMoments = ['pre-start', 'start'] as const;
export type RepairMoment = (typeof repairMoments)[number];

/** The condition reason a reservation carries while a repair found no place for a bad member. */
export const bookingRepairFailedReason = 'BookingRepairFailed';

/** One booked member (an allocation) as BookingRepair sees its node and atoms. */
export interface BookedMember {
  allocationId: string;
  nodeId: string;
  nodeName: string;
  gangIndex: number;
  /** How often this member was re-placed on its own (carried over when BookingRepair moves it). */
  memberAttempt?: number;
  deviceIds: string[];
  start: number;
  end: number;
  provisionState: string;
  cordoned: boolean;
  draining: boolean;
  maintenance: boolean;
  connectivity: string;
  /** The type of a NoSchedule condition on the node, if any. */
  noSchedule: string | null;
  /** Booked atoms that are unhealthy or gone (stable ids). */
  unhealthyAtoms: string[];
  labels: Record<string, string>;
}

/**
 * Why a booked member cannot be kept, or null when it can: the node is draining, cordoned, in
 * maintenance, not ready, not connected, carries a NoSchedule condition, or a booked atom is
 * unhealthy. The first that applies, in that order, as a short phrase (it goes into events).
 */
export function memberTrouble(m: BookedMember): string | null {
  if (m.draining) return 'draining';
  if (m.cordoned) return 'cordoned';
  if (m.maintenance) return 'maintenance';
  if (m.provisionState !== 'ready') return `not ready (${m.provisionState})`;
  if (m.connectivity !== 'connected') return 'unreachable';
  if (m.noSchedule) return `NoSchedule condition ${m.noSchedule}`;
  if (m.unhealthyAtoms.length > 0) return `unhealthy atoms ${m.unhealthyAtoms.join(', ')}`;
  return null;
}

/** One member moved by a repair: from where to where, and why. */
export interface RepairMove {
  gangIndex: number;
  reason: string;
  fromAllocationId: string;
  fromNodeId: string;
  fromNodeName: string;
  fromDeviceIds: string[];
  toAllocationId: string;
  toNodeId: string;
  toNodeName: string;
  toDeviceIds: string[];
}

/** What one BookingRepair did. */
export type RepairOutcome =
  /** Not `placed` any more (started, ended, or moved on): nothing checked. */
  | { outcome: 'skipped'; state: string | null }
  /** Every member is fine (a BookingRepairFailed condition left from before is cleared). */
  | { outcome: 'healthy'; members: number }
  | { outcome: 'repaired'; moves: RepairMove[] }
  /**
   * No place for every bad member (nothing moved: all or nothing). Before the start the good
   * bookings stay and the reservation carries the condition; at the start it went back to `pending`.
   */
  | {
      outcome: 'failed';
      message: string;
      bad: Array<{ allocationId: string; nodeId: string; reason: string }>;
      state: 'placed' | 'pending';
    };

/**
 * The id of the BookingRepair workflow of one reservation at one moment: one per repair, the same
 * on every retry of the lifecycle's step, so a repair is never run twice at once.
 */
export function bookingRepairWorkflowId(reservationId: string, moment: RepairMoment): string {
  return `booking-repair-${reservationId}-${moment}`;
}

/**
 * The moment whose repair is due for a reservation in `placed`, or null: only calendar
 * reservations are repaired; `pre-start` from `preStartMs` before the start, `start` at it; a
 * moment already done (`done`) is not due again.
 */
export function dueRepairMoment(
  s: { calendar?: boolean; start: number | null; now: number },
  preStartMs: number,
  done: readonly RepairMoment[],
): RepairMoment | null {
  if (!s.calendar || s.start === null) return null;
  if (s.now >= s.start) return done.includes('start') ? null : 'start';
  if (s.now >= s.start - preStartMs) return done.includes('pre-start') ? null : 'pre-start';
  return null;
}
