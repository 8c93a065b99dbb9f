import type { Db } from '../core/database.ts';
import type { Logger } from '../core/logger.ts';
import { type AdvanceOutcome, advanceRollout } from '../db/rollouts/advance.ts';
import type { RolloutRequest } from '../domain/rollout-states.ts';

export interface RolloutActivityDeps {
  db: Db;
  log: Logger;
}

/** The rollout workflow's one activity: a step of the rollout, in one transaction. */
export function createRolloutActivities({ db, log }: RolloutActivityDeps) {
  return {
    /**
     * Reads the rollout, decides (`decideRollout`) with at most one operator request, and applies
     * the decision in one transaction (`advanceRollout`): health-gate verdicts, starts within each
     * pool's budget, the wave, the state and the events. Idempotent: a retry re-reads and decides
     * again; a node is never started twice. NOT_FOUND when the rollout is gone.
     */
    async advanceRollout(input: {
      rolloutId: string;
      request: RolloutRequest | null;
    }): Promise<AdvanceOutcome> {
      const outcome = await advanceRollout(db, input);
      if (input.request)
        log.info(
          { rolloutId: input.rolloutId, request: input.request, state: outcome.state },
          'rollout request applied',
        );
      return outcome;
    },
  };
}

export type RolloutActivities = ReturnType<typeof createRolloutActivities>;
