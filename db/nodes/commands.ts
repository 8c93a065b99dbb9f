import { type Selectable, sql, type Transaction } from 'kysely';
import type { Database, Db, NodeCommandsTable } from '../../core/database.ts';
import { type CommandKind, commandKinds, isCommandKind } from '../../domain/command-kinds.ts';
import { ComputeError } from '../../domain/errors.ts';
import { type CommandLane, type CommandState, inFlightCommandStates } from '../../domain/fleet.ts';
import { newId } from '../../domain/ids.ts';
import { commandMetalWorkflow } from '../metal/workflows.ts';
import { preparedMarker } from '../pool.ts';
import { literalList } from '../sql-literals.ts';
import { notifyNodeWork } from './command-notify.ts';

type Trx = Transaction<Database>;

export interface EnqueuedCommand {
  id: string;
  seq: number;
  lane: CommandLane;
}

/**
 * Writes a durable command for one node in the caller's transaction, with the node's next `seq`
 * (taken under the node's row lock, so seqs are gap-free and ordered). The gateway delivers it in
 * order within its lane. INVALID_INPUT for an unknown kind, a payload its kind refuses, or a
 * control-plane-only kind without `byControlPlane`; INVALID_STATE for a node whose role the kind
 * does not run on; NOT_FOUND for an unknown node. Not idempotent by itself: call it once per state change.
 * Its commit notifies the gateways (`notifyNodeWork`), which deliver at once.
 */
export async function enqueueNodeCommand(
  trx: Trx,
  input: {
    nodeId: string;
    kind: string;
    payload?: Record<string, unknown>;
    notBefore?: Date | null;
    notAfter?: Date | null;
    /** A not_after this many seconds after the database's clock (instead of `notAfter`). */
    notAfterSeconds?: number;
    minGeneration?: number | null;
    /** Set by the control plane's own callers only: allows the kinds marked `controlPlaneOnly`. */
    byControlPlane?: boolean;
  },
): Promise<EnqueuedCommand> {
  if (!isCommandKind(input.kind)) {
    throw new ComputeError('INVALID_INPUT', `unknown command kind ${input.kind}`, {
      kinds: Object.keys(commandKinds),
    });
  }
  const kind: CommandKind = commandKinds[input.kind];
  if (kind.controlPlaneOnly && !input.byControlPlane) {
    throw new ComputeError(
      'INVALID_INPUT',
      `kind: ${input.kind} is queued only by the control plane (it carries the BMC's sealed credential and the site's boot lease epoch): use the metal API (metal.power, metal.bootDevice, metal.virtualMedia, metal.inventory)`,
      { field: 'kind' },
    );
  }
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
    .returning([sql<string>`next_command_seq - 1`.as('seq'), 'role'])
    .executeTakeFirst();
  if (!node) throw new ComputeError('NOT_FOUND', `node ${input.nodeId} does not exist`);
  if (!kind.roles.includes(node.role)) {
    throw new ComputeError(
      'INVALID_STATE',
      `node ${input.nodeId} has role ${node.role}; ${input.kind} runs only on a node of role ${kind.roles.join(' or ')}`,
      { role: node.role, roles: [...kind.roles] },
    );
  }
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
      not_after:
        input.notAfterSeconds === undefined
          ? (input.notAfter ?? null)
          : sql<Date>`compute_now() + make_interval(secs => ${input.notAfterSeconds})`,
      min_generation: input.minGeneration ?? null,
    })
    .execute();
  // The gateway holding the node's session delivers at this commit, not at its next poll.
  await notifyNodeWork(trx, input.nodeId);
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

function commandView(row: Selectable<NodeCommandsTable>): CommandView {
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

export async function findNodeCommand(db: Db | Trx, id: string): Promise<CommandView | null> {
  const row = await db.selectFrom('node_commands').selectAll().where('id', '=', id).executeTakeFirst();
  return row ? commandView(row) : null;
}

/** The latest `limit` commands of a node, newest (highest seq) first. */
export async function listNodeCommands(db: Db, nodeId: string, limit: number): Promise<CommandView[]> {
  const rows = await db
    .selectFrom('node_commands')
    .selectAll()
    .where('node_id', '=', nodeId)
    .orderBy('seq', 'desc')
    .limit(limit)
    .execute();
  return rows.map(commandView);
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
    WHERE c.kind = t.kind AND c.state IN (${literalList(inFlightCommandStates)})
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

const queuedColumns = [
  'id',
  'seq',
  'kind',
  'lane',
  'payload',
  'not_before',
  'not_after',
  'min_generation',
] as const;

type QueuedRow = Pick<Selectable<NodeCommandsTable>, (typeof queuedColumns)[number]>;

/** A command row as a session delivers it; its times may come as JSON strings (a row built in SQL). */
export function queuedCommand(
  row: Omit<QueuedRow, 'not_before' | 'not_after'> & {
    not_before: Date | string | null;
    not_after: Date | string | null;
  },
): QueuedCommandRow {
  return {
    id: row.id,
    seq: Number(row.seq),
    kind: row.kind,
    lane: row.lane,
    payload: row.payload,
    notBefore: row.not_before === null ? null : new Date(row.not_before),
    notAfter: row.not_after === null ? null : new Date(row.not_after),
    minGeneration: row.min_generation === null ? null : Number(row.min_generation),
  };
}

/**
 * Queued commands due now (past not_before, before not_after) for the nodes whose session this
 * gateway holds (of `nodeIds` when given), by node and seq, at most `limit`.
 */
export async function findDeliverableCommands(
  db: Db,
  gatewayId: string,
  limit = 5000,
  /** Only these nodes' commands (a notification named them); all the gateway's nodes when absent. */
  nodeIds?: readonly string[],
): Promise<Array<QueuedCommandRow & { nodeId: string }>> {
  const onlyNodes = nodeIds ? sql`AND c.node_id = ANY(${[...nodeIds]}::text[])` : sql``;
  const { rows } = await sql<QueuedRow & { node_id: string }>`${sql.raw(preparedMarker)}
    SELECT c.id, c.node_id, c.seq, c.kind, c.lane, c.payload, c.not_before, c.not_after, c.min_generation
    FROM node_commands c JOIN nodes n ON n.id = c.node_id
    WHERE c.state = 'queued' AND n.session_gateway = ${gatewayId} ${onlyNodes}
      AND (c.not_before IS NULL OR c.not_before <= compute_now())
      AND (c.not_after IS NULL OR c.not_after > compute_now())
    ORDER BY c.node_id, c.seq
    LIMIT ${limit}`.execute(db);
  return rows.map((row) => ({ ...queuedCommand(row), nodeId: row.node_id }));
}

/**
 * Marks commands delivered to a journal, each only while still queued (a command another gateway
 * or an expiry took first is left alone). Answers the ids it marked: only those may be sent.
 */
export async function markCommandsDelivered(
  db: Db,
  deliveries: ReadonlyArray<{ commandId: string; journalId: string }>,
): Promise<Set<string>> {
  if (deliveries.length === 0) return new Set();
  const { rows } = await sql<{ id: string }>`
    UPDATE node_commands c SET state = 'delivered', delivered_at = compute_now(), journal_id = t.journal
    FROM unnest(${deliveries.map((d) => d.commandId)}::text[], ${deliveries.map((d) => d.journalId)}::text[])
      AS t(id, journal)
    WHERE c.id = t.id AND c.state = 'queued'
    RETURNING c.id`.execute(db);
  return new Set(rows.map((r) => r.id));
}

/**
 * Stores a command's result: only for a command of this node with that exact seq, delivered and
 * not yet answered, while the node's epoch is still `epoch`. Answers what was stored, or null,
 * having changed nothing (an answer sent again, a wrong seq, an unknown command or a fenced
 * session: `findNodeCommandSeq` and the node's epoch tell which).
 */
export async function completeDeliveredCommand(
  db: Db,
  input: {
    nodeId: string;
    epoch: number;
    commandId: string;
    seq: number;
    state: 'succeeded' | 'failed' | 'expired';
    result: Record<string, unknown> | null;
    error: string | null;
  },
): Promise<StoredCommandResult | null> {
  const { rows } = await sql<{ metal_workflow_id: string | null }>`
    UPDATE node_commands c SET state = ${input.state},
      result = ${input.result === null ? null : JSON.stringify(input.result)}::jsonb,
      error = ${input.error}, completed_at = compute_now()
    FROM nodes n
    WHERE c.id = ${input.commandId} AND c.node_id = ${input.nodeId} AND c.seq = ${input.seq}
      AND c.state IN (${literalList(inFlightCommandStates)}) AND n.id = c.node_id AND n.epoch = ${input.epoch}
    RETURNING ${commandMetalWorkflow} AS metal_workflow_id`.execute(db);
  return rows[0] ? { metalWorkflowId: rows[0].metal_workflow_id } : null;
}

/** A command result stored, and the provisioning workflow it may have been waiting for. */
export interface StoredCommandResult {
  /** The workflow running on the command's machine (a `bmc.*` command's, or the node's own). */
  metalWorkflowId: string | null;
}

/** The seq of a node's command, or null when the node has no such command. */
export async function findNodeCommandSeq(db: Db, nodeId: string, commandId: string): Promise<number | null> {
  const row = await db
    .selectFrom('node_commands')
    .where('id', '=', commandId)
    .where('node_id', '=', nodeId)
    .select('seq')
    .executeTakeFirst();
  return row ? Number(row.seq) : null;
}
