import type { Db } from '../db/pool.ts';
import type { Logger } from '../server/logger.ts';
import type { StepResult } from './reservation.ts';

export interface PlacementActivityDeps {
  db: Db;
  log: Logger;
}

/** Placement from the lifecycle: a pending reservation tries again (admission's placer). */
export function createPlacementActivities(_deps: PlacementActivityDeps) {
  return {
    /** Places a pending reservation (one transaction, guarded by its version). */
    async placeReservationAgain(_input: {
      reservationId: string;
      expectedVersion: number;
    }): Promise<StepResult> {
      return { applied: false, state: null };
    },
  };
}

export type PlacementActivities = ReturnType<typeof createPlacementActivities>;
