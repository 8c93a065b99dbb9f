import {
  condition,
  continueAsNew,
  proxyActivities,
  setHandler,
  upsertSearchAttributes,
  workflowInfo,
} from '@temporalio/workflow';
// biome-ignore lint/style/noRestrictedImports: a type-only import, erased before bundling
import type { RolloutActivities } from '../../activities/rollout.ts';
import type { RolloutRequest } from '../../domain/rollout-states.ts';
import { searchAttributes } from '../search-attributes.ts';
import {
  abortRolloutSignal,
  pauseRolloutSignal,
  type RolloutWorkflowInput,
  resumeRolloutSignal,
  rolloutProgressQuery,
} from './messages.ts';

const { advanceRollout } = proxyActivities<RolloutActivities>({
  startToCloseTimeout: '1 minute',
  retry: { initialInterval: '1 second', maximumInterval: '30 seconds' },
});

/**
 * One rollout, level-triggered: each step reads the rollout from PostgreSQL and applies one decision
 * (`advanceRollout`), then waits for a signal or, while nodes are in their health gate, for the next
 * look. Paused with nothing in progress, it waits for resume or abort only. Its search attributes
 * (release, wave, state) let the Temporal UI answer "which rollouts are paused".
 */
export async function rolloutWorkflow(input: RolloutWorkflowInput): Promise<{ state: string }> {
  const pending: RolloutRequest[] = [...(input.pending ?? [])];
  let progress: { state: string; wave: number; steps: number } | null = null;
  setHandler(pauseRolloutSignal, (args) => {
    pending.push({ kind: 'pause', ...(args?.reason ? { reason: args.reason } : {}) });
  });
  setHandler(resumeRolloutSignal, () => {
    pending.push({ kind: 'resume' });
  });
  setHandler(abortRolloutSignal, (args) => {
    pending.push({ kind: 'abort', rollback: args?.rollback === true });
  });
  setHandler(rolloutProgressQuery, () => progress);
  let steps = 0;
  let shown = '';
  for (;;) {
    const request = pending.shift() ?? null;
    const outcome = await advanceRollout({ rolloutId: input.rolloutId, request });
    steps++;
    progress = { state: outcome.state, wave: outcome.currentWave, steps };
    const wave = `${outcome.currentWave + 1}/${outcome.waveCount}`;
    if (shown !== `${outcome.state} ${wave}`) {
      shown = `${outcome.state} ${wave}`;
      upsertSearchAttributes([
        { key: searchAttributes.state, value: outcome.state },
        { key: searchAttributes.release, value: outcome.releaseId },
        { key: searchAttributes.wave, value: wave },
      ]);
    }
    if (outcome.finished) return { state: outcome.state };
    if (pending.length > 0) continue;
    if (workflowInfo().continueAsNewSuggested || steps >= 2_000) {
      await continueAsNew<typeof rolloutWorkflow>({ ...input, pending });
    }
    const waitsForOperator = outcome.state === 'paused' && outcome.inProgress === 0;
    if (waitsForOperator) await condition(() => pending.length > 0);
    else await condition(() => pending.length > 0, input.pollMs ?? outcome.pollMs);
  }
}
