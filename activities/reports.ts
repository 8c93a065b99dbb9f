import type { Db } from '../core/database.ts';
import type { Logger } from '../core/logger.ts';
import { judgeReservationReports } from '../db/allocations/reports.ts';

export interface ReportActivityDeps {
  db: Db;
  log: Logger;
}

/** Node reports as the worker judges them: a stored report counts only once its signature verifies. */
export function createReportActivities({ db, log }: ReportActivityDeps) {
  return {
    /**
     * Judges the latest stored report of every allocation of the reservation's current placement,
     * in one transaction (`judgeAllocationReport`: verified bound/failed/released reports change the
     * allocation; a rejected one writes `reservation.binding-rejected`). A bound allocation whose
     * later report fails verification is marked `binding_lost_at` (the reservation is then
     * Degraded/BindingLost). Idempotent: judging the same reports again changes nothing.
     */
    async judgeReports(input: { reservationId: string }): Promise<{ outcomes: Record<string, string> }> {
      const outcomes = await db
        .transaction()
        .execute((trx) => judgeReservationReports(trx, input.reservationId));
      for (const [allocationId, outcome] of Object.entries(outcomes)) {
        if (outcome === 'rejected' || outcome === 'binding-lost') {
          log.warn({ reservationId: input.reservationId, allocationId, outcome }, 'report rejected');
        }
      }
      return { outcomes };
    },
  };
}

export type ReportActivities = ReturnType<typeof createReportActivities>;
