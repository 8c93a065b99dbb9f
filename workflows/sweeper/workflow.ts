import { patched, proxyActivities } from '@temporalio/workflow';
// biome-ignore lint/style/noRestrictedImports: a type-only import, erased before bundling
import type { DraftCleanupActivities } from '../../activities/draft-cleanup.ts';
// biome-ignore lint/style/noRestrictedImports: a type-only import, erased before bundling
import type { RolloutActivities } from '../../activities/rollout.ts';
// biome-ignore lint/style/noRestrictedImports: a type-only import, erased before bundling
import type { SweeperActivities } from '../../activities/sweeper.ts';

const {
  sweepOrphanReservations,
  sweepOrphanPreemptions,
  sweepExpiredHolds,
  sweepUnfinishedDrains,
  sweepOwedLifecycleWakes,
} = proxyActivities<SweeperActivities>({
  startToCloseTimeout: '2 minutes',
  retry: { maximumAttempts: 3 },
});

const { sweepOrphanRollouts } = proxyActivities<RolloutActivities>({
  startToCloseTimeout: '1 minute',
  retry: { maximumAttempts: 3 },
});

const { removeRefusedDrafts } = proxyActivities<DraftCleanupActivities>({
  startToCloseTimeout: '1 minute',
  retry: { maximumAttempts: 3 },
});

/** Batches of refused drafts one sweep removes at most (each one transaction of `draftBatch` rows). */
const maxDraftBatches = 20;

/**
 * Run by the sweeper Schedule: starts (or wakes) the lifecycle of every non-terminal reservation
 * that has no running workflow, such as one whose API process died between commit and start, and
 * the workflow of every open spot preemption notice and of every running or paused rollout that has
 * none, announces lapsed host holds, finishes drains left unfinished and wakes the lifecycles of
 * ended reservations that their release or cancel did not tell; then,
 * given `draftRetentionMs`, removes refused requests older than it, a bounded batch per activity
 * while batches come back full (at most 20 a run; the next run goes on).
 */
export async function orphanSweeper(
  input: { graceMs?: number; limit?: number; draftRetentionMs?: number; draftBatch?: number } = {},
) {
  const sweep = { graceMs: input.graceMs ?? 10_000, limit: input.limit ?? 1_000 };
  const reservations = await sweepOrphanReservations(sweep);
  const preemptions = await sweepOrphanPreemptions(sweep);
  const rollouts = await sweepOrphanRollouts(sweep);
  // Host holds that lapsed: their `hold.expired` events, then the ones past their hour retired.
  await sweepExpiredHolds({ limit: sweep.limit });
  // Drains whose last allocation ended without finishing them (the ending paths finish them too).
  if (patched('sweeper-finish-drains')) await sweepUnfinishedDrains({ limit: sweep.limit });
  // Ended reservations whose lifecycle the release or cancel did not tell (its process died).
  if (patched('sweeper-owed-wakes')) await sweepOwedLifecycleWakes(sweep);
  const swept = {
    ...reservations,
    ...(preemptions.started.length ? { preemptions: preemptions.started } : {}),
    ...(rollouts.started.length ? { rollouts: rollouts.started } : {}),
  };
  if (input.draftRetentionMs === undefined) return swept;
  const batch = input.draftBatch ?? 500;
  let removedDrafts = 0;
  for (let i = 0; i < maxDraftBatches; i++) {
    const { removed } = await removeRefusedDrafts({ retentionMs: input.draftRetentionMs, limit: batch });
    removedDrafts += removed;
    if (removed < batch) break;
  }
  return { ...swept, removedDrafts };
}
