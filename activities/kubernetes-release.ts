import type { Db } from '../core/database.ts';
import type { Logger } from '../core/logger.ts';
import { lockReservationAtVersion } from '../db/reservations/lifecycle.ts';
import { carryHeldRelease, finishHeldRelease } from '../db/reservations/releasing.ts';
import type { ForcedReleaseReason } from '../domain/kubernetes-release.ts';
import { asActivity } from './failure.ts';

/**
 * The steps of a held `kubernetes` release (domain/kubernetes-release.ts): carry its bookings
 * while pods hold the GPUs past the end, and finish it. Each is one transaction guarded by the
 * reservation's version and the `releasing` state, so a retry after a commit changes nothing.
 */
export function createKubernetesReleaseActivities({ db, log }: { db: Db; log: Logger }) {
  return {
    /**
     * Moves the held allocations' bookings to `until` (unbilled). When another booking already
     * takes the carried span, the release is forced instead (`carry-refused`), in the same
     * transaction. Answers what it did.
     */
    async carryRelease(input: {
      reservationId: string;
      expectedVersion: number;
      until: number;
    }): Promise<{ applied: boolean; outcome: 'carried' | 'forced' | 'unchanged' }> {
      return asActivity(() =>
        db.transaction().execute(async (trx) => {
          const row = await lockReservationAtVersion(trx, input.reservationId, input.expectedVersion);
          if (!row || row.state !== 'releasing') return { applied: false, outcome: 'unchanged' as const };
          const carried = await carryHeldRelease(trx, row.id, new Date(input.until));
          if (carried === 'carried') {
            log.info({ reservationId: row.id, until: input.until }, 'held release carried');
            return { applied: true, outcome: 'carried' as const };
          }
          await finishHeldRelease(trx, row, 'carry-refused');
          log.warn({ reservationId: row.id }, 'held release forced: the carried span is booked by another');
          return { applied: true, outcome: 'forced' as const };
        }),
      );
    },

    /** Ends a `releasing` reservation: the node reported its GPUs free, or the release is forced. */
    async finishRelease(input: {
      reservationId: string;
      expectedVersion: number;
      forced: ForcedReleaseReason | null;
    }): Promise<{ applied: boolean }> {
      return asActivity(() =>
        db.transaction().execute(async (trx) => {
          const row = await lockReservationAtVersion(trx, input.reservationId, input.expectedVersion);
          if (!row || row.state !== 'releasing') return { applied: false };
          await finishHeldRelease(trx, row, input.forced);
          if (input.forced) log.warn({ reservationId: row.id, reason: input.forced }, 'held release forced');
          else log.info({ reservationId: row.id }, 'held release finished');
          return { applied: true };
        }),
      );
    },
  };
}

export type KubernetesReleaseActivities = ReturnType<typeof createKubernetesReleaseActivities>;
