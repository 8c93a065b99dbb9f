import type { Db } from '../core/database.ts';
import type { Logger } from '../core/logger.ts';
import { readPreemption, releasePreempted } from '../db/reservations/preemption.ts';
import { asActivity } from './failure.ts';

export interface PreemptionActivityDeps {
  db: Db;
  log: Logger;
}

/** The spot preemption workflow's steps: a look, and the release at the deadline (one transaction each). */
export function createPreemptionActivities({ db, log }: PreemptionActivityDeps) {
  return {
    /** compute_now() and the spot reservations still under this notice (read-only). */
    async observePreemption(input: {
      spotReservationIds: string[];
      deadline: number;
    }): Promise<{ now: number; open: string[] }> {
      return readPreemption(db, input);
    },

    /**
     * Releases the spot reservations whose notice deadline has come (reason `preempted`, event
     * `reservation.preempted`), in one transaction, in id order. Idempotent: one already released,
     * or not yet due, changes nothing.
     */
    async releasePreemptedReservations(input: {
      spotReservationIds: string[];
      deadline: number;
      preemptedBy: string;
    }): Promise<{ released: string[] }> {
      const released = await asActivity(() =>
        db.transaction().execute(async (trx) => {
          const done: string[] = [];
          for (const reservationId of [...input.spotReservationIds].sort()) {
            const args = { reservationId, deadline: input.deadline, preemptedBy: input.preemptedBy };
            if (await releasePreempted(trx, args)) done.push(reservationId);
          }
          return done;
        }),
      );
      if (released.length > 0)
        log.info({ released, preemptedBy: input.preemptedBy }, 'spot reservations preempted');
      return { released };
    },
  };
}

export type PreemptionActivities = ReturnType<typeof createPreemptionActivities>;
