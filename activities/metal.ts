import type { Db } from '../core/database.ts';
import type { Logger } from '../core/logger.ts';
import { advanceMetalWorkflow, type MetalAdvanceOutcome } from '../db/metal/workflow-advance.ts';

export interface MetalActivityDeps {
  db: Db;
  log: Logger;
}

/** The provisioning workflows' one activity. */
export function createMetalActivities({ db, log }: MetalActivityDeps) {
  return {
    /**
     * One step of a provisioning workflow in one transaction (`advanceMetalWorkflow`): an abort
     * acted on, the running attempt judged, the next attempt or step started, the node moved on.
     * Idempotent: a retry re-reads and never queues a step's command twice. NOT_FOUND when the
     * workflow is gone.
     */
    async advanceMetalWorkflow(input: { workflowId: string }): Promise<MetalAdvanceOutcome> {
      const outcome = await advanceMetalWorkflow(db, input.workflowId);
      if (outcome.finished || outcome.waitsForOperator) {
        log.info(
          { workflowId: input.workflowId, state: outcome.state, step: outcome.step },
          'metal workflow',
        );
      }
      return outcome;
    },
  };
}

export type MetalActivities = ReturnType<typeof createMetalActivities>;
