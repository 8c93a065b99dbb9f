import type { Db } from '../core/database.ts';
import type { Logger } from '../core/logger.ts';
import { withPlacementTransaction } from '../db/allocations/placement.ts';
import { NoNodeLeft, replaceGangMembers } from '../db/reservations/gang-members.ts';
import { lockReservationAtVersion } from '../db/reservations/lifecycle.ts';
import { asActivity } from './failure.ts';
import type { StepResult } from './reservation.ts';

export interface GangActivityDeps {
  db: Db;
  log: Logger;
}

/** What re-placing gang members answers: the step's result, or why no node was left. */
export interface ReplaceMembersResult extends StepResult {
  /** Set when a member found no node: nothing changed, and the binding attempt fails as a whole. */
  noNodeLeft?: string;
}

/** The lifecycle's gang steps. */
export function createGangActivities({ db, log }: GangActivityDeps) {
  return {
    /**
     * Re-places the gang members that did not bind on their own, in one transaction guarded by the
     * reservation's version and state (`binding`), retried on a lost placement race; the other
     * members keep their bookings. When a member finds no node, the transaction rolls back and the
     * answer carries `noNodeLeft` (the lifecycle then fails the whole attempt, releasing every
     * booking in one transaction). Idempotent: a moved-on version changes nothing.
     */
    async replaceGangMembers(input: {
      reservationId: string;
      expectedVersion: number;
      allocationIds: string[];
      reason: string;
      bindDeadline: number;
    }): Promise<ReplaceMembersResult> {
      return asActivity(async () => {
        try {
          return await withPlacementTransaction(db, async (trx) => {
            const row = await lockReservationAtVersion(trx, input.reservationId, input.expectedVersion);
            if (row?.state !== 'binding') return { applied: false, state: row?.state ?? null };
            const moves = await replaceGangMembers(trx, row, input);
            if (moves.length > 0) {
              log.warn({ reservationId: row.id, reason: input.reason, moves }, 'gang members re-placed');
            }
            return { applied: moves.length > 0, state: 'binding' };
          });
        } catch (error) {
          if (!(error instanceof NoNodeLeft)) throw error;
          log.warn(
            { reservationId: input.reservationId, reason: error.message },
            'no node left for a gang member',
          );
          return { applied: false, state: 'binding', noNodeLeft: error.message };
        }
      });
    },
  };
}

export type GangActivities = ReturnType<typeof createGangActivities>;
