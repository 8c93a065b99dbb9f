import {
  type Client,
  ScheduleAlreadyRunning,
  type ScheduleOptionsStartWorkflowAction,
  ScheduleOverlapPolicy,
  type Workflow,
} from '@temporalio/client';
import { orphanSweeperType } from '../workflows/sweeper/messages.ts';

export const sweeperScheduleId = 'better-compute-orphan-sweeper';

/**
 * Creates the orphan-sweeper Schedule when it does not exist, or brings an existing one to this
 * configuration (idempotent: a second worker with the same settings changes nothing). It runs
 * `orphanSweeper` every `everyMs` on `taskQueue`, skipping a run while the previous one still runs;
 * with `draftRetentionMs`, each run also removes refused requests older than that.
 */
export async function ensureSweeperSchedule(
  client: Client,
  options: {
    taskQueue: string;
    everyMs?: number;
    graceMs?: number;
    scheduleId?: string;
    draftRetentionMs?: number;
  },
): Promise<void> {
  const scheduleId = options.scheduleId ?? sweeperScheduleId;
  const everyMs = options.everyMs ?? 60_000;
  const args = {
    graceMs: options.graceMs ?? 10_000,
    ...(options.draftRetentionMs !== undefined ? { draftRetentionMs: options.draftRetentionMs } : {}),
  };
  const action: ScheduleOptionsStartWorkflowAction<Workflow> = {
    type: 'startWorkflow',
    workflowType: orphanSweeperType,
    taskQueue: options.taskQueue,
    args: [args],
  };
  try {
    await client.schedule.create({
      scheduleId,
      spec: { intervals: [{ every: everyMs }] },
      action,
      policies: { overlap: ScheduleOverlapPolicy.SKIP, catchupWindow: '1 minute' },
    });
  } catch (error) {
    if (!(error instanceof ScheduleAlreadyRunning)) throw error;
    const handle = client.schedule.getHandle(scheduleId);
    const current = await handle.describe();
    const sameQueue =
      current.action.type === 'startWorkflow' && current.action.taskQueue === options.taskQueue;
    const sameEvery = current.spec.intervals?.[0]?.every === everyMs;
    const sameArgs =
      current.action.type === 'startWorkflow' &&
      JSON.stringify(current.action.args ?? []) === JSON.stringify([args]);
    if (sameQueue && sameEvery && sameArgs) return;
    await handle.update((previous) => ({
      ...previous,
      spec: { intervals: [{ every: everyMs }] },
      action,
      state: { paused: previous.state.paused, note: previous.state.note },
    }));
  }
}
