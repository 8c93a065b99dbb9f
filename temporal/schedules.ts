import { type Client, ScheduleAlreadyRunning, ScheduleOverlapPolicy } from '@temporalio/client';
import { orphanSweeperType } from '../workflows/sweeper/messages.ts';

export const sweeperScheduleId = 'better-compute-orphan-sweeper';

/**
 * Creates the orphan-sweeper Schedule when it does not exist (idempotent: a second call, from
 * another worker, changes nothing). It runs `orphanSweeper` every `everyMs` on `taskQueue`,
 * skipping a run while the previous one still runs.
 */
export async function ensureSweeperSchedule(
  client: Client,
  options: { taskQueue: string; everyMs?: number; graceMs?: number; scheduleId?: string },
): Promise<void> {
  try {
    await client.schedule.create({
      scheduleId: options.scheduleId ?? sweeperScheduleId,
      spec: { intervals: [{ every: options.everyMs ?? 60_000 }] },
      action: {
        type: 'startWorkflow',
        workflowType: orphanSweeperType,
        taskQueue: options.taskQueue,
        args: [{ graceMs: options.graceMs ?? 10_000 }],
      },
      policies: { overlap: ScheduleOverlapPolicy.SKIP, catchupWindow: '1 minute' },
    });
  } catch (error) {
    if (!(error instanceof ScheduleAlreadyRunning)) throw error;
  }
}
