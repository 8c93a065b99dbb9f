import { sql, type Transaction } from 'kysely';
import type { Database, Db } from '../../core/database.ts';
import { commandKinds, isCommandKind } from '../../domain/command-kinds.ts';
import { ComputeError } from '../../domain/errors.ts';
import type { CommandLane, CommandState } from '../../domain/fleet.ts';
import { newId } from '../../domain/ids.ts';

type Trx = Transaction<Database>;

export interface EnqueuedCommand {
  id: string;
  seq: number;
  lane: CommandLane;
}

/**
 * Writes a durable command for one node in the caller's transaction, with the node's next `seq`
 * (taken under the node's row lock, so seqs are gap-free and ordered). The gateway delivers it in
 * order within its lane. INVALID_INPUT for an unknown kind or a payload its kind refuses;
 * NOT_FOUND for an unknown node. Not idempotent by itself: call it once per state change.
 */
export async function enqueueNodeCommand(
  trx: Trx,
  input: {
    nodeId: string;
    kind: string;
    payload?: Record<string, unknown>;
    notBefore?: Date | null;
    notAfter?: Date | null;
    minGeneration?: number | null;
  },
): Promise<EnqueuedCommand> {
  if (!isCommandKind(input.kind)) {
    throw new ComputeError('INVALID_INPUT', `unknown command kind ${input.kind}`, {
      kinds: Object.keys(commandKinds),
    });
  }
  const kind = commandKinds[input.kind];
  const parsed = kind.payload.safeParse(input.payload ?? {});
  if (!parsed.success) {
    throw new ComputeError(
      'INVALID_INPUT',
      `bad payload for ${input.kind}: ${parsed.error.issues[0]?.message}`,
    );
  }
  const node = await trx
    .updateTable('nodes')
    .set({ next_command_seq: sql<string>`next_command_seq + 1` })
    .where('id', '=', input.nodeId)
    .returning(sql<string>`next_command_seq - 1`.as('seq'))
    .executeTakeFirst();
  if (!node) throw new ComputeError('NOT_FOUND', `node ${input.nodeId} does not exist`);
  const id = newId('cmd');
  await trx
    .insertInto('node_commands')
    .values({
      id,
      node_id: input.nodeId,
      seq: node.seq,
      kind: input.kind,
      lane: kind.lane,
      payload: JSON.stringify(parsed.data),
      not_before: input.notBefore ?? null,
      not_after: input.notAfter ?? null,
      min_generation: input.minGeneration ?? null,
    })
    .execute();
  return { id, seq: Number(node.seq), lane: kind.lane };
}

export interface CommandView {
  id: string;
  nodeId: string;
  seq: number;
  kind: string;
  lane: CommandLane;
  state: CommandState;
  payload: Record<string, unknown>;
  result: Record<string, unknown> | null;
  error: string | null;
  createdAt: Date;
  deliveredAt: Date | null;
  completedAt: Date | null;
}

export async function findNodeCommand(db: Db | Trx, id: string): Promise<CommandView | null> {
  const row = await db.selectFrom('node_commands').selectAll().where('id', '=', id).executeTakeFirst();
  if (!row) return null;
  return {
    id: row.id,
    nodeId: row.node_id,
    seq: Number(row.seq),
    kind: row.kind,
    lane: row.lane,
    state: row.state,
    payload: row.payload,
    result: row.result,
    error: row.error,
    createdAt: row.created_at,
    deliveredAt: row.delivered_at,
    completedAt: row.completed_at,
  };
}

/**
 * Fails every command a lost journal had in flight (delivered or running), instead of replaying
 * it: the daemon can no longer tell whether it ran. Answers how many failed.
 */
export async function failInFlightCommands(trx: Trx, nodeId: string, reason: string): Promise<number> {
  const result = await trx
    .updateTable('node_commands')
    .set({ state: 'failed', error: reason, completed_at: sql<Date>`compute_now()` })
    .where('node_id', '=', nodeId)
    .where('state', 'in', ['delivered', 'running'])
    .executeTakeFirst();
  return Number(result.numUpdatedRows);
}

/** Expires queued commands whose not_after has passed (they are never delivered). */
export async function expireOverdueCommands(db: Db): Promise<number> {
  const result = await db
    .updateTable('node_commands')
    .set({
      state: 'expired',
      error: 'not_after passed before delivery',
      completed_at: sql<Date>`compute_now()`,
    })
    .where('state', '=', 'queued')
    .where('not_after', '<=', sql<Date>`compute_now()`)
    .executeTakeFirst();
  return Number(result.numUpdatedRows);
}

/**
 * Fails commands a node took and never answered within their kind's timeout (measured from
 * delivery). A result that arrives later changes nothing. Answers how many failed.
 */
export async function failTimedOutCommands(db: Db): Promise<number> {
  const kinds = Object.entries(commandKinds).map(([kind, k]) => ({ kind, seconds: k.timeoutMs / 1000 }));
  const result = await sql<{ id: string }>`
    UPDATE node_commands c SET state = 'failed', error = 'timed out: no result within the kind''s timeout',
      completed_at = compute_now()
    FROM unnest(${kinds.map((k) => k.kind)}::text[], ${kinds.map((k) => k.seconds)}::float8[]) AS t(kind, seconds)
    WHERE c.kind = t.kind AND c.state IN ('delivered', 'running')
      AND c.delivered_at < compute_now() - make_interval(secs => t.seconds)
    RETURNING c.id`.execute(db);
  return result.rows.length;
}

/** A queued command as a session delivers it. */
export interface QueuedCommandRow {
  id: string;
  seq: number;
  kind: string;
  lane: CommandLane;
  payload: Record<string, unknown>;
  notBefore: Date | null;
  notAfter: Date | null;
  minGeneration: number | null;
}
