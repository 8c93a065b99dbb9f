/**
 * The messages of a provisioning workflow (Temporal workflow id = the metal workflow's id),
 * importable by the API without the body. `wake` is the one signal: abort and retry are written
 * to PostgreSQL by the API first (the truth), and the signal only wakes the workflow, which then
 * acts on them at once, whatever it was waiting for.
 */
import { defineQuery, defineSignal } from '@temporalio/workflow';
import { metalWorkflowNames } from '../../domain/metal-steps.ts';

export interface MetalWorkflowInput {
  workflowId: string;
  /** How often the workflow looks at a step it waits on, without a wake-up (default 1 s). */
  pollMs?: number;
}

export const wakeMetalWorkflowSignal = defineSignal<[]>(metalWorkflowNames.wakeSignal);

/** The last step's outcome as the workflow saw it. */
export const metalProgressQuery = defineQuery<{ state: string; step: string | null; rounds: number } | null>(
  'progress',
);
