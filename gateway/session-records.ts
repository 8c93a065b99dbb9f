import type { Db } from '../core/database.ts';
import { completeSiteAgentCommand } from '../db/metal/site-leases.ts';
import {
  completeDeliveredCommand,
  findNodeCommandSeq,
  type StoredCommandResult,
} from '../db/nodes/commands.ts';
import { findNodeEpoch, type SessionFence, setObservedGeneration } from '../db/nodes/sessions.ts';
import { ComputeError } from '../domain/errors.ts';
import type { NodeRole } from '../domain/fleet.ts';
import { CommandOutcome, type CommandResult } from '../proto/gen/agent/v1/agent.ts';
import { sessionFenced } from './fence.ts';
import { afterSiteResultStored, refuseStaleSiteResult } from './site-agents.ts';

const outcomeState: Partial<Record<CommandOutcome, 'succeeded' | 'failed' | 'expired'>> = {
  [CommandOutcome.COMMAND_OUTCOME_SUCCEEDED]: 'succeeded',
  [CommandOutcome.COMMAND_OUTCOME_FAILED]: 'failed',
  [CommandOutcome.COMMAND_OUTCOME_EXPIRED]: 'expired',
  [CommandOutcome.COMMAND_OUTCOME_REJECTED]: 'failed',
  [CommandOutcome.COMMAND_OUTCOME_INTERRUPTED]: 'failed',
};

/**
 * Records the converged spec generation (a joined node that sent its inventory becomes `ready`
 * with it); a fenced session changes nothing (INVALID_STATE).
 */
export async function recordObservedGeneration(
  db: Db,
  session: SessionFence,
  generation: number,
): Promise<void> {
  if (!(await setObservedGeneration(db, session, generation))) throw sessionFenced();
}

/**
 * Stores a command's result: only for a command of this node with that exact seq, delivered and
 * not yet answered, on the session holding the node's epoch. A result the journal sends again
 * after a reconnect answers null and changes nothing; an unknown command is NOT_FOUND, a seq
 * that does not match is INVALID_INPUT.
 */
export async function recordCommandResult(
  db: Db,
  session: SessionFence,
  result: CommandResult,
  peer?: { role: NodeRole; siteId: string },
): Promise<StoredCommandResult | null> {
  // A site agent's bmc.* results count only under the boot lease epoch they were sent with.
  const site = peer?.role === 'site';
  const state = outcomeState[result.outcome];
  if (!state) throw new ComputeError('INVALID_INPUT', 'command result without an outcome');
  let payload: Record<string, unknown> | null = null;
  if (result.resultJson.length > 0) {
    if (result.resultJson.length > 64 * 1024)
      throw new ComputeError('INVALID_INPUT', 'command result too large');
    try {
      payload = JSON.parse(Buffer.from(result.resultJson).toString('utf8'));
    } catch {
      throw new ComputeError('INVALID_INPUT', 'command result is not JSON');
    }
  }
  const stored = await (site ? completeSiteAgentCommand : completeDeliveredCommand)(db, {
    nodeId: session.nodeId,
    epoch: session.epoch,
    commandId: result.commandId,
    seq: Number(result.seq),
    state,
    result: payload,
    error: result.error ? result.error.slice(0, 2000) : null,
  });
  if (stored) {
    if (site) await afterSiteResultStored(db, result.commandId);
    return stored;
  }
  if (site)
    await refuseStaleSiteResult(db, { nodeId: session.nodeId, siteId: peer.siteId }, result.commandId);
  const seq = await findNodeCommandSeq(db, session.nodeId, result.commandId);
  if (seq === null) throw new ComputeError('NOT_FOUND', `unknown command ${result.commandId}`);
  if (seq !== Number(result.seq)) {
    throw new ComputeError('INVALID_INPUT', `command ${result.commandId} has seq ${seq}, not ${result.seq}`);
  }
  if ((await findNodeEpoch(db, session.nodeId)) !== session.epoch) throw sessionFenced();
  return null;
}
