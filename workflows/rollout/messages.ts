/**
 * The messages of the rollout workflow (id = rollout id): importable by the API and the CLI without
 * the workflow body. pause, resume and abort are signals (fire and forget); the API answers with
 * the state the rollout reaches in PostgreSQL.
 */
import { defineQuery, defineSignal } from '@temporalio/workflow';
import { rolloutWorkflow } from '../../domain/rollout-states.ts';

export const rolloutWorkflowType = rolloutWorkflow.type;

export interface RolloutWorkflowInput {
  rolloutId: string;
  /** How often the health gates are looked at while nodes are in progress (default: from the soak). */
  pollMs?: number;
  /** Requests received and not yet applied, carried across continue-as-new. */
  pending?: Array<import('../../domain/rollout-states.ts').RolloutRequest>;
}

export const pauseRolloutSignal = defineSignal<[{ reason?: string }]>(rolloutWorkflow.signals.pause);
export const resumeRolloutSignal = defineSignal<[]>(rolloutWorkflow.signals.resume);
export const abortRolloutSignal = defineSignal<[{ rollback: boolean }]>(rolloutWorkflow.signals.abort);

/** The last step's outcome as the workflow saw it. */
export const rolloutProgressQuery = defineQuery<{ state: string; wave: number; steps: number } | null>(
  'progress',
);
