import type { AdmissionCaches } from '../core/admission-caches.ts';
import type { Db } from '../core/database.ts';
import type { ReservationLifecycle } from '../core/deps.ts';
import type { Logger } from '../core/logger.ts';
import { withPlacementTransaction } from '../db/allocations/placement.ts';
import { lockReservationAtVersion } from '../db/reservations/lifecycle.ts';
import { placeReservation } from '../db/reservations/placement.ts';
import type { PreemptionSummary } from '../domain/preemption.ts';
import type { StepResult } from './reservation.ts';

export interface PlacementActivityDeps {
  db: Db;
  log: Logger;
  /** The process's admission caches, so a retry does not re-read the pool's schedulable nodes. */
  caches: AdmissionCaches;
  /** Starts the preemption workflow of a placement that preempted spot reservations. */
  lifecycle?: Pick<ReservationLifecycle, 'preempt'>;
}

/** Placement from the lifecycle: a pending reservation tries again with admission's placer. */
export function createPlacementActivities({ db, log, caches, lifecycle }: PlacementActivityDeps) {
  return {
    /**
     * Places a pending reservation (the retry every pendingRetry, or at once when capacity was
     * freed) in one transaction guarded by its version, retried on a lost placement race. Placed:
     * allocation, bookings, `reservation.placed`; no fit: it stays pending with `Unschedulable`.
     */
    async placeReservationAgain(input: {
      reservationId: string;
      expectedVersion: number;
    }): Promise<StepResult> {
      let preemption: PreemptionSummary | undefined;
      const result = await withPlacementTransaction(db, async (trx): Promise<StepResult> => {
        preemption = undefined;
        const row = await lockReservationAtVersion(trx, input.reservationId, input.expectedVersion);
        if (row?.state !== 'pending') return { applied: false, state: row?.state ?? null };
        const outcome = await placeReservation(trx, input.reservationId, { caches });
        if (outcome.outcome === 'placed') {
          log.info(
            { reservationId: input.reservationId, nodeId: outcome.nodeId },
            'pending reservation placed',
          );
          preemption = outcome.preemption;
          return { applied: true, state: 'placed' };
        }
        return { applied: false, state: outcome.outcome === 'pending' ? 'pending' : outcome.state };
      });
      // After commit: the preemption's own workflow owns its notice (the spot lifecycles back it up).
      if (preemption) await lifecycle?.preempt?.(preemption);
      return result;
    },
  };
}

export type PlacementActivities = ReturnType<typeof createPlacementActivities>;
