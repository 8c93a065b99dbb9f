import type { Db } from '../core/database.ts';
import type { SessionFence } from '../db/nodes/sessions.ts';
import { recordBcdUpdateStatus } from '../db/rollouts/bcd-status.ts';
import { ComputeError } from '../domain/errors.ts';
import { type BcdUpdateState, bcdUpdateStates } from '../domain/release-commands.ts';
import type { UpdateStatus } from '../proto/gen/agent/v1/agent.ts';
import { sessionFenced } from './fence.ts';

/**
 * Stores bcd's report on its own update (what a rollout's health gate reads), stamped with the
 * session's epoch. INVALID_INPUT for a state outside the closed set; a fenced session closes.
 */
export async function recordUpdateStatus(db: Db, session: SessionFence, status: UpdateStatus): Promise<void> {
  if (!(bcdUpdateStates as readonly string[]).includes(status.state)) {
    throw new ComputeError(
      'INVALID_INPUT',
      `updateStatus.state must be one of ${bcdUpdateStates.join(', ')}, not ${status.state}`,
    );
  }
  const stored = await recordBcdUpdateStatus(db, session, {
    releaseId: status.releaseId,
    version: status.version,
    state: status.state as BcdUpdateState,
    message: status.message,
  });
  if (!stored) throw sessionFenced();
}
