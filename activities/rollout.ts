import { type Client, WorkflowExecutionAlreadyStartedError } from '@temporalio/client';
import type { Db } from '../core/database.ts';
import type { Logger } from '../core/logger.ts';
import { type AdvanceOutcome, advanceRollout } from '../db/rollouts/advance.ts';
import { findLiveRolloutIds } from '../db/rollouts/rollouts.ts';
import { type RolloutRequest, rolloutWorkflow, rolloutWorkflowStart } from '../domain/rollout-states.ts';

export interface RolloutActivityDeps {
  db: Db;
  log: Logger;
  /** The worker's client and task queue, to start the workflow of a rollout left without one. */
  temporal?: { client: Client; taskQueue: string };
}

/** The rollout workflow's one activity (a step of the rollout), and the sweeper's look at rollouts. */
export function createRolloutActivities({ db, log, temporal }: RolloutActivityDeps) {
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

    /**
     * No running or paused rollout may be without its workflow (such as one whose `rollouts.create`
     * committed and whose start then failed): starts the workflow of every such rollout older than
     * `graceMs`. Idempotent: a start while the workflow runs is refused by its id and skipped; a
     * workflow that ended (terminated, failed) while PostgreSQL says the rollout goes on is started
     * anew, and it picks up where the rows are.
     */
    async sweepOrphanRollouts(input: { graceMs: number; limit: number }): Promise<{ started: string[] }> {
      if (!temporal) return { started: [] };
      const started: string[] = [];
      for (const id of await findLiveRolloutIds(db, input)) {
        try {
          await temporal.client.workflow.start(
            rolloutWorkflow.type,
            rolloutWorkflowStart(id, temporal.taskQueue),
          );
          started.push(id);
        } catch (error) {
          if (!(error instanceof WorkflowExecutionAlreadyStartedError)) throw error;
        }
      }
      if (started.length > 0) log.warn({ started }, 'started workflows of orphaned rollouts');
      return { started };
    },
  };
}

export type RolloutActivities = ReturnType<typeof createRolloutActivities>;
