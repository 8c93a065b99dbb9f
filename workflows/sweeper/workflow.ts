import { proxyActivities } from '@temporalio/workflow';
// biome-ignore lint/style/noRestrictedImports: a type-only import, erased before bundling
import type { SweeperActivities } from '../../activities/sweeper.ts';

const { sweepOrphanReservations } = proxyActivities<SweeperActivities>({
  startToCloseTimeout: '2 minutes',
  retry: { maximumAttempts: 3 },
});

/**
 * Run by the sweeper Schedule: starts (or wakes) the lifecycle of every non-terminal reservation
 * that has no running workflow, such as one whose API process died between commit and start.
 */
export async function orphanSweeper(input: { graceMs?: number; limit?: number } = {}) {
  return sweepOrphanReservations({ graceMs: input.graceMs ?? 10_000, limit: input.limit ?? 1_000 });
}
