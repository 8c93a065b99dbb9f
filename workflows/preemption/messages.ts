/**
 * The spot preemption workflow's input and messages, importable by the API, the worker and the
 * CLI without pulling in the workflow body. One run per preempting placement; its id is the
 * PreemptionSummary's `id` (`preemption-<regular reservation>-<deadline>`).
 */
import { defineQuery, defineSignal } from '@temporalio/workflow';
import type { PreemptionSummary } from '../../domain/preemption.ts';

export const preemptionWorkflowType = 'spotPreemption';

export interface PreemptionWorkflowInput extends PreemptionSummary {
  /** How long one activity attempt may run before Temporal retries it elsewhere (30 s). */
  activityTimeoutMs?: number;
}

/** Look again now (the clock moved, or an operator asks): the notice timer is only the fallback. */
export const preemptionWakeSignal = defineSignal<[{ reason: string }?]>('wake');

/** Where the preemption stands: the deadline, the spot reservations still under notice, and those released. */
export const preemptionStatusQuery = defineQuery<{ deadline: number; open: string[]; released: string[] }>(
  'status',
);
