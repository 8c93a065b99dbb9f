import { sql } from 'kysely';
import type { Db } from '../core/database.ts';
import { ComputeError } from '../domain/errors.ts';
import { CommandOutcome, type CommandResult } from '../proto/gen/agent/v1/agent.ts';
import { sessionFenced } from './fence.ts';

/** The session writes that carry its epoch: a fenced session changes nothing (INVALID_STATE). */
interface Fence {
  nodeId: string;
  epoch: number;
}

const outcomeState: Partial<Record<CommandOutcome, 'succeeded' | 'failed' | 'expired'>> = {
  [CommandOutcome.COMMAND_OUTCOME_SUCCEEDED]: 'succeeded',
  [CommandOutcome.COMMAND_OUTCOME_FAILED]: 'failed',
  [CommandOutcome.COMMAND_OUTCOME_EXPIRED]: 'expired',
  [CommandOutcome.COMMAND_OUTCOME_REJECTED]: 'failed',
  [CommandOutcome.COMMAND_OUTCOME_INTERRUPTED]: 'failed',
};

export async function recordObservedGeneration(db: Db, session: Fence, generation: number): Promise<void> {
  const result = await db
    .updateTable('nodes')
    .set({ observed_generation: generation })
    .where('id', '=', session.nodeId)
    .where('epoch', '=', String(session.epoch))
    .executeTakeFirst();
  if (Number(result.numUpdatedRows) === 0) throw sessionFenced();
  await markReadyIfConverged(db, session);
}

/** A joined node becomes `ready` once it converged a spec and sent its inventory. */
export async function markReadyIfConverged(db: Db, session: Fence): Promise<void> {
  await sql`
    UPDATE nodes SET provision_state = 'ready', updated_at = compute_now()
    WHERE id = ${session.nodeId} AND epoch = ${session.epoch} AND provision_state = 'enrolling'
      AND observed_generation >= 1
      AND EXISTS (SELECT 1 FROM inventory_snapshots s WHERE s.node_id = nodes.id)`.execute(db);
}

/**
 * Stores a command's result: only for a command of this node with that exact seq, delivered and
 * not yet answered, on the session holding the node's epoch. A result the journal sends again
 * after a reconnect answers false and changes nothing; an unknown command is NOT_FOUND, a seq
 * that does not match is INVALID_INPUT.
 */
export async function recordCommandResult(db: Db, session: Fence, result: CommandResult): Promise<boolean> {
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
  const updated = await sql<{ id: string }>`
    UPDATE node_commands c SET state = ${state}, result = ${payload === null ? null : JSON.stringify(payload)}::jsonb,
      error = ${result.error ? result.error.slice(0, 2000) : null}, completed_at = compute_now()
    FROM nodes n
    WHERE c.id = ${result.commandId} AND c.node_id = ${session.nodeId} AND c.seq = ${Number(result.seq)}
      AND c.state IN ('delivered', 'running') AND n.id = c.node_id AND n.epoch = ${session.epoch}
    RETURNING c.id`.execute(db);
  if (updated.rows.length > 0) return true;
  const row = await db
    .selectFrom('node_commands')
    .where('id', '=', result.commandId)
    .where('node_id', '=', session.nodeId)
    .select(['seq', 'state'])
    .executeTakeFirst();
  if (!row) throw new ComputeError('NOT_FOUND', `unknown command ${result.commandId}`);
  if (Number(row.seq) !== Number(result.seq)) {
    throw new ComputeError(
      'INVALID_INPUT',
      `command ${result.commandId} has seq ${row.seq}, not ${result.seq}`,
    );
  }
  const epoch = await db
    .selectFrom('nodes')
    .select('epoch')
    .where('id', '=', session.nodeId)
    .executeTakeFirst();
  if (Number(epoch?.epoch) !== session.epoch) throw sessionFenced();
  return false;
}
