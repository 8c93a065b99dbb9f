import type { AdmissionCaches } from '../core/admission-caches.ts';
import type { Db } from '../core/database.ts';
import type { Logger } from '../core/logger.ts';
import { withPlacementTransaction } from '../db/allocations/placement.ts';
import { repairReservationBookings } from '../db/reservations/repair.ts';
import type { RepairMoment, RepairOutcome } from '../domain/booking-repair.ts';
import { asActivity } from './failure.ts';

export interface BookingRepairActivityDeps {
  db: Db;
  log: Logger;
  /** The process's admission caches (the placer's heuristic inputs). */
  caches: AdmissionCaches;
}

/** BookingRepair's one step: check a calendar reservation's booked members and re-place the bad ones. */
export function createBookingRepairActivities({ db, log, caches }: BookingRepairActivityDeps) {
  return {
    /**
     * Checks every booked node and atom of a `placed` reservation and re-places the bad members in
     * one transaction, all or nothing (repairReservationBookings), retried on a lost placement
     * race. Idempotent: a repeat finds the members healthy or the reservation moved on (`skipped`).
     */
    async repairBookings(input: {
      reservationId: string;
      moment: RepairMoment;
      workflowId: string;
    }): Promise<RepairOutcome> {
      return asActivity(async () => {
        const outcome = await withPlacementTransaction(db, (trx) =>
          repairReservationBookings(trx, { ...input, caches }),
        );
        const context = { reservationId: input.reservationId, moment: input.moment };
        if (outcome.outcome === 'repaired') {
          log.info({ ...context, moves: outcome.moves.length }, 'calendar booking repaired');
        } else if (outcome.outcome === 'failed') {
          log.warn(
            { ...context, state: outcome.state, message: outcome.message },
            'booking repair found no fit',
          );
        }
        return outcome;
      });
    },
  };
}

export type BookingRepairActivities = ReturnType<typeof createBookingRepairActivities>;
