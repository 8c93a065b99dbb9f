import { sql } from 'kysely';
import type { Db } from '../core/database.ts';
import type { Logger } from '../core/logger.ts';
import { judgeAllocationReport } from '../db/allocations/reports.ts';

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
      return db.transaction().execute(async (trx) => {
        const allocations = await trx
          .selectFrom('allocations')
          .where('reservation_id', '=', input.reservationId)
          .where('superseded_at', 'is', null)
          .where((eb) =>
            eb.exists(
              eb.selectFrom('allocation_reports as r').whereRef('r.allocation_id', '=', 'allocations.id'),
            ),
          )
          .select('id')
          .orderBy('id')
          .execute();
        const outcomes: Record<string, string> = {};
        for (const { id } of allocations) {
          const judged = await judgeAllocationReport(trx, id);
          outcomes[id] = judged.outcome;
          if (judged.outcome === 'binding-lost') {
            await trx
              .updateTable('allocations')
              .set({ binding_lost_at: sql<Date>`COALESCE(binding_lost_at, compute_now())` })
              .where('id', '=', id)
              .execute();
          }
          if (judged.outcome === 'rejected' || judged.outcome === 'binding-lost') {
            log.warn(
              { reservationId: input.reservationId, allocationId: id, outcome: judged.outcome },
              'report rejected',
            );
          }
        }
        return { outcomes };
      });
    },
  };
}

export type ReportActivities = ReturnType<typeof createReportActivities>;
