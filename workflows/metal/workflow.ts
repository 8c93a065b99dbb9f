import {
  condition,
  continueAsNew,
  getExternalWorkflowHandle,
  proxyActivities,
  setHandler,
  upsertSearchAttributes,
  workflowInfo,
} from '@temporalio/workflow';
// biome-ignore lint/style/noRestrictedImports: a type-only import, erased before bundling
import type { MetalActivities } from '../../activities/metal.ts';
import { wakeSignal } from '../reservation/messages.ts';
import { searchAttributes } from '../search-attributes.ts';
import { type MetalWorkflowInput, metalProgressQuery, wakeMetalWorkflowSignal } from './messages.ts';

// One transaction a call: 30 s, as the reservation lifecycle's, is what a worker killed during
// one costs before another worker retries it.
const { advanceMetalWorkflow } = proxyActivities<MetalActivities>({
  startToCloseTimeout: '30 seconds',
  retry: {
    initialInterval: '1 second',
    maximumInterval: '30 seconds',
    nonRetryableErrorTypes: ['NOT_FOUND'],
  },
});

/**
 * One provisioning workflow (deploy, inspect, clean), level-triggered: each round reads the
 * workflow from PostgreSQL and does what is due in one transaction (`advanceMetalWorkflow`), then
 * waits for a wake-up (abort, retry) or the next look. Failed, it waits for the operator only.
 * Its search attributes (node, site, profile, state, step) let the Temporal UI find it.
 */
export async function metalWorkflow(input: MetalWorkflowInput): Promise<{ state: string }> {
  let woken = false;
  let progress: { state: string; step: string | null; rounds: number } | null = null;
  setHandler(wakeMetalWorkflowSignal, () => {
    woken = true;
  });
  setHandler(metalProgressQuery, () => progress);
  let rounds = 0;
  let shown = '';
  for (;;) {
    woken = false;
    const outcome = await advanceMetalWorkflow({ workflowId: input.workflowId });
    rounds++;
    progress = { state: outcome.state, step: outcome.step, rounds };
    const label = `${outcome.state} ${outcome.step ?? ''}`;
    if (label !== shown) {
      shown = label;
      upsertSearchAttributes([
        { key: searchAttributes.state, value: outcome.state },
        { key: searchAttributes.node, value: outcome.nodeId },
        { key: searchAttributes.site, value: outcome.siteId },
        ...(outcome.profileId ? [{ key: searchAttributes.profile, value: outcome.profileId }] : []),
        ...(outcome.step ? [{ key: searchAttributes.step, value: outcome.step }] : []),
      ]);
    }
    // A dedicated-root lease waits on this deploy (or wipe): wake its lifecycle when it is decided.
    if (outcome.reservationId && (outcome.finished || outcome.waitsForOperator)) {
      await wakeLease(outcome.reservationId, `metal workflow ${input.workflowId} ${outcome.state}`);
    }
    if (outcome.finished) return { state: outcome.state };
    if (workflowInfo().continueAsNewSuggested || rounds >= 5_000) {
      await continueAsNew<typeof metalWorkflow>(input);
    }
    if (outcome.waitsForOperator) await condition(() => woken);
    else await condition(() => woken, input.pollMs ?? 1_000);
  }
}

/** Wakes a lease's lifecycle; one already over has nothing to wake. */
async function wakeLease(reservationId: string, reason: string): Promise<void> {
  try {
    await getExternalWorkflowHandle(reservationId).signal(wakeSignal, { reason });
  } catch {
    // The lifecycle is over (or not started yet): it reads the truth when it next looks.
  }
}
