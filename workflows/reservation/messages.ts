/**
 * The messages of the reservation lifecycle workflow: importable by the API, the gateway and the
 * CLI without pulling in the workflow body. Signals are wake-ups; updates are what a caller waits
 * on, each with a validator so bad input never enters history; queries read the last look.
 */
import { defineQuery, defineSignal, defineUpdate } from '@temporalio/workflow';
import type { RepairMoment } from '../../domain/booking-repair.ts';
import type { LifecycleTimers, ReservationSnapshot } from '../../domain/reservation-lifecycle.ts';

export const reservationWorkflowType = 'reservationLifecycle';

/** What starts (and continues) a lifecycle. Everything else is read from PostgreSQL. */
export interface ReservationWorkflowInput {
  reservationId: string;
  /** Overrides of the pool's timers (tests use seconds). */
  timers?: Partial<LifecycleTimers>;
  /** How long one activity attempt may run before Temporal retries it elsewhere (30 s). */
  activityTimeoutMs?: number;
  /** Continue as new after this many history events (besides Temporal's own suggestion). */
  historyLimit?: number;
  /** Carried across continue-as-new. */
  carried?: {
    lastPlaceAttemptAt: number | null;
    meteredThrough: number | null;
    release: boolean;
    cancel: boolean;
    confirmation: 'approved' | 'denied' | null;
    lastState: string | null;
    reportsPending?: boolean;
    /** The BookingRepair moments already run. */
    repairsDone?: RepairMoment[];
  };
}

/** A wake-up with no payload of its own: look again (admission, the sweeper, an extend). */
export const wakeSignal = defineSignal<[{ reason: string }?]>('wake');

/** A node's report about one allocation, after the gateway wrote it to the allocation's row. */
export interface AllocationReportSignal {
  allocationId: string;
  kind: 'bound' | 'failed' | 'released';
}
export const allocationReportSignal = defineSignal<[AllocationReportSignal]>('allocationReport');

/** Capacity was freed in the pool: a pending reservation tries to place at once. */
export const capacityFreedSignal = defineSignal<[{ poolId: string }]>('capacityFreed');

/** Release the reservation now (reason `release`); a pending one is cancelled. Answers the end state. */
export const releaseUpdate = defineUpdate<{ state: string }, []>('release');

/** Withdraw a reservation that has not started (`pending`, `placed` or awaiting confirmation). */
export const cancelUpdate = defineUpdate<{ state: string }, []>('cancel');

/**
 * Move the lease to compute_now() plus `leaseSeconds`, in `placed`, `binding` or `active`. Answers
 * the new deadline in epoch milliseconds. INVALID_STATE in a terminal state or without a lease.
 */
export const renewUpdate = defineUpdate<{ leaseExpiresAt: number }, []>('renew');

/** An extend committed: the end moved to `end` (epoch ms). Answers the end the workflow now keeps. */
export const extendedUpdate = defineUpdate<{ end: number | null }, [{ end: number }]>('extended');

/** A person decided a delegated confirmation. */
export const confirmationUpdate = defineUpdate<{ state: string }, [{ decision: 'approved' | 'denied' }]>(
  'confirmation',
);

/** The last snapshot the workflow read from PostgreSQL. */
export const snapshotQuery = defineQuery<ReservationSnapshot | null>('snapshot');
