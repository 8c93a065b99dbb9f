import { type RawBuilder, sql, type Transaction } from 'kysely';
import type { Database, Db } from '../../core/database.ts';
import { ComputeError } from '../../domain/errors.ts';
import { inFlightCommandStates } from '../../domain/fleet.ts';
import { runningMetalWorkflowOf } from '../metal/workflows.ts';
import { executePrepared, preparedMarker } from '../pool.ts';
import { literalList } from '../sql-literals.ts';
import { type QueuedCommandRow, queuedCommand } from './commands.ts';

/**
 * A node's session on a gateway, as the database keeps it: the node's `epoch` (each new session
 * increments it and so fences the older one), `session_gateway`, `last_heartbeat_at`,
 * `connectivity` and the `NodeUnreachable` condition. Every session write carries its epoch.
 */

type Trx = Transaction<Database>;

/** The node and epoch a session holds; a write under an older epoch changes nothing. */
export interface SessionFence {
  nodeId: string;
  epoch: number;
}

export interface OpenedNodeSession {
  epoch: number;
  generation: number;
  spec: Record<string, unknown>;
  /** Commands of a lost journal that were failed instead of replayed. */
  failedInFlight: number;
  /** The node had been marked unreachable: its reservations' lifecycles should look again. */
  wasUnreachable: boolean;
  /** Commands delivered to this journal and not answered: sent again (the journal dedupes). */
  redeliver: QueuedCommandRow[];
  /** The provisioning workflow running on this machine (it may be waiting for this very join). */
  metalWorkflowId: string | null;
  /** The latest hash the control plane holds for each inventory section of the node. */
  heldSectionHashes: Map<string, string>;
}

/**
 * Opens a session in one statement, under the node's row lock: increments the node's epoch
 * (fencing any older session), marks it connected on `gatewayId`, records its agent, protocol
 * version, capabilities (as system labels `bc.dev/cap.<capability>`) and journal, and clears
 * `NodeUnreachable`. A journal id other than the stored one means the old journal is lost: its
 * in-flight commands fail instead of being replayed. Answers, from the same statement, the
 * commands to send again and the inventory hashes held. NOT_FOUND when the node no longer exists.
 * One round trip whatever the node reports: a herd of nodes opens at once.
 */
export async function openNodeSession(
  db: Db | Trx,
  input: {
    nodeId: string;
    gatewayId: string;
    agentVersion: string | null;
    /** The session protocol bcd declared (rollout health gates read it). */
    protocolVersion: number;
    capabilities: readonly string[];
    journalId: string;
  },
): Promise<OpenedNodeSession> {
  const { nodeId, journalId } = input;
  const keys = input.capabilities.map((c) => `bc.dev/cap.${c}`);
  // Every CTE sees the rows as of the statement's snapshot: the commands to send again are read
  // as they were (none when the journal was lost, whose in-flight commands `lost` fails), and the
  // label writes touch disjoint keys. `before` is the node as locked, its latest version: when a
  // transaction changed the node after the snapshot (a liveness sweep that marked it unreachable
  // and raised NodeUnreachable while this waited for the row), the snapshot is `stale`.
  const { rows } = await sql<
    {
      epoch: string;
      spec: Record<string, unknown>;
      spec_generation: string;
      before_connectivity: string;
      journal_lost: boolean;
      stale: boolean;
      metal_workflow_id: string | null;
    } & SessionOpenReads
  >`${sql.raw(preparedMarker)}
    WITH before AS (
      SELECT id, connectivity, xmin::text AS locked_version,
        (journal_id IS NOT NULL AND journal_id <> ${journalId}) AS journal_lost
      FROM nodes WHERE id = ${nodeId} FOR NO KEY UPDATE
    ), opened AS (
      UPDATE nodes SET
        epoch = nodes.epoch + 1,
        connectivity = 'connected',
        session_gateway = ${input.gatewayId},
        last_heartbeat_at = compute_now(),
        agent_version = ${input.agentVersion},
        capabilities = ${[...input.capabilities]}::text[],
        journal_id = ${journalId},
        power_state = 'on',
        protocol_version = ${input.protocolVersion}::int,
        updated_at = compute_now()
      FROM before WHERE nodes.id = before.id
      RETURNING nodes.id, nodes.epoch, nodes.spec, nodes.spec_generation, before.journal_lost,
                before.connectivity AS before_connectivity, before.locked_version
    ), ${sessionOpenWrites(nodeId, sql`(SELECT journal_lost FROM before)`)}, gone AS (
      DELETE FROM node_labels
      WHERE node_id = ${nodeId} AND source = 'system' AND key LIKE 'bc.dev/cap.%' AND NOT (key = ANY(${keys}::text[]))
    ), capability_labels AS (
      INSERT INTO node_labels (node_id, key, value, source)
      SELECT ${nodeId}, key, 'true', 'system' FROM unnest(${keys}::text[]) AS key
      WHERE EXISTS (SELECT 1 FROM before)
      ON CONFLICT (node_id, source, key) DO UPDATE SET value = EXCLUDED.value
    )
    SELECT opened.epoch, opened.spec, opened.spec_generation, opened.before_connectivity, opened.journal_lost,
      opened.locked_version <> (SELECT xmin::text FROM nodes WHERE id = ${nodeId}) AS stale,
      ${runningMetalWorkflowOf(sql`opened.id`)} AS metal_workflow_id,
      ${sessionOpenReads(nodeId, journalId, sql`opened.journal_lost`)}
    FROM opened`.execute(db);
  const row = rows[0];
  if (!row) throw new ComputeError('NOT_FOUND', 'the node no longer exists');
  let reads: SessionOpenReads = row;
  if (row.stale) {
    // Done again with a snapshot taken after the lock: what the snapshot could not see (a
    // NodeUnreachable raised, a command delivered meanwhile) is cleared, failed or sent again.
    // Should this statement fail, the node's next session clears it (the row now says connected).
    const { rows: again } = await sql<SessionOpenReads>`${sql.raw(preparedMarker)}
      WITH ${sessionOpenWrites(nodeId, sql`${row.journal_lost}::boolean`)}
      SELECT ${sessionOpenReads(nodeId, journalId, sql`${row.journal_lost}::boolean`)}`.execute(db);
    reads = {
      ...again[0]!,
      failed_in_flight: String(Number(row.failed_in_flight) + Number(again[0]!.failed_in_flight)),
    };
  }
  return {
    epoch: Number(row.epoch),
    generation: Number(row.spec_generation),
    spec: row.spec,
    failedInFlight: Number(reads.failed_in_flight),
    wasUnreachable: row.before_connectivity === 'unreachable',
    redeliver: reads.redeliver.map(queuedCommand),
    metalWorkflowId: row.metal_workflow_id,
    heldSectionHashes: new Map(Object.entries(reads.held)),
  };
}

/** What opening a session reads besides the node: see sessionOpenReads. */
interface SessionOpenReads {
  failed_in_flight: string;
  redeliver: Array<Parameters<typeof queuedCommand>[0]>;
  held: Record<string, string>;
}

/**
 * The WITH-list parts (`lost`, `reachable`) of opening a session that write besides the node: a
 * lost journal's in-flight commands fail, and `NodeUnreachable` is cleared.
 */
function sessionOpenWrites(nodeId: string, journalLost: RawBuilder<unknown>): RawBuilder<unknown> {
  return sql`lost AS (
      UPDATE node_commands SET state = 'failed', error = 'the node lost its journal', completed_at = compute_now()
      WHERE node_id = ${nodeId} AND state IN (${literalList(inFlightCommandStates)}) AND ${journalLost}
      RETURNING 1
    ), reachable AS (
      DELETE FROM node_conditions WHERE node_id = ${nodeId} AND type = 'NodeUnreachable'
    )`;
}

/**
 * The select-list part of opening a session that reads: how many commands `lost` failed, the
 * commands to send again (those the journal took and never answered; none when it was lost) and
 * the latest inventory hash held for each section.
 */
function sessionOpenReads(
  nodeId: string,
  journalId: string,
  journalLost: RawBuilder<unknown>,
): RawBuilder<unknown> {
  return sql`(SELECT count(*) FROM lost) AS failed_in_flight,
      CASE WHEN ${journalLost} THEN '[]'::json ELSE (
        SELECT COALESCE(json_agg(json_build_object('id', c.id, 'seq', c.seq, 'kind', c.kind, 'lane', c.lane,
            'payload', c.payload, 'not_before', c.not_before, 'not_after', c.not_after,
            'min_generation', c.min_generation) ORDER BY c.seq), '[]'::json)
        FROM node_commands c
        WHERE c.node_id = ${nodeId} AND c.state IN (${literalList(inFlightCommandStates)}) AND c.journal_id = ${journalId}
      ) END AS redeliver,
      (SELECT COALESCE(json_object_agg(s.section, s.hash), '{}'::json) FROM (
        SELECT DISTINCT ON (section) section, hash FROM inventory_snapshots
        WHERE node_id = ${nodeId} ORDER BY section, id DESC
      ) s) AS held`;
}

/**
 * Locks the node's row (`update`, or `share` for a write that only needs the node to stay put)
 * while the session still holds its epoch. Answers false when a newer session fenced this one:
 * the caller then changes nothing.
 *
 * `update` is FOR NO KEY UPDATE, as every lock this project takes on a node's or a pool's row:
 * a booking's foreign keys take FOR KEY SHARE on the node after it holds the node's host rows,
 * so a FOR UPDATE here, followed by the inventory's write of those host rows, was a deadlock.
 */
export async function lockNodeAtEpoch(
  trx: Trx,
  fence: SessionFence,
  mode: 'update' | 'share',
): Promise<boolean> {
  const query = trx
    .selectFrom('nodes')
    .where('id', '=', fence.nodeId)
    .where('epoch', '=', String(fence.epoch))
    .select('id');
  const rows = await executePrepared(trx, mode === 'update' ? query.forNoKeyUpdate() : query.forShare());
  return rows.length > 0;
}

/** The node's current epoch, or null when the node no longer exists. */
export async function findNodeEpoch(db: Db, nodeId: string): Promise<number | null> {
  const row = await db.selectFrom('nodes').select('epoch').where('id', '=', nodeId).executeTakeFirst();
  return row ? Number(row.epoch) : null;
}

/**
 * Whether a joined (`enrolling`) node is ready once its converged generation is `observed`: a spec
 * converged and an inventory sent (stored, or `inventoryWritten` by the statement itself, whose
 * own snapshots it cannot read). An SQL condition over the `nodes` row being updated.
 */
export const readyOnceObserved = (observed: RawBuilder<unknown>, inventoryWritten = sql`false`) =>
  sql<boolean>`(nodes.provision_state = 'enrolling' AND ${observed} >= 1
    AND (${inventoryWritten} OR EXISTS (SELECT 1 FROM inventory_snapshots s WHERE s.node_id = nodes.id)))`;

/**
 * Records the spec generation the node converged, and makes a joined node `ready` when that was
 * the last thing it lacked (markNodeReadyIfConverged), in one statement; false (nothing written)
 * for a fenced session.
 */
export async function setObservedGeneration(
  db: Db,
  fence: SessionFence,
  generation: number,
): Promise<boolean> {
  const ready = readyOnceObserved(sql`${generation}::bigint`);
  const { rows } = await sql<{ id: string }>`${sql.raw(preparedMarker)}
    UPDATE nodes SET observed_generation = ${generation}::bigint,
      provision_state = CASE WHEN ${ready} THEN 'ready' ELSE nodes.provision_state END,
      updated_at = CASE WHEN ${ready} THEN compute_now() ELSE nodes.updated_at END
    WHERE id = ${fence.nodeId} AND epoch = ${fence.epoch}
    RETURNING id`.execute(db);
  return rows.length > 0;
}

/** A closed session lets go of its node, unless a newer session or another gateway holds it. */
export async function releaseSessionGateway(
  db: Db,
  session: SessionFence & { gatewayId: string },
): Promise<void> {
  await db
    .updateTable('nodes')
    .set({ session_gateway: null })
    .where('id', '=', session.nodeId)
    .where('epoch', '=', String(session.epoch))
    .where('session_gateway', '=', session.gatewayId)
    .execute();
}

/** The nodes held by `gatewayId` whose NodeSpec is newer than what they converged. */
export async function findSpecsToSend(
  db: Db,
  gatewayId: string,
): Promise<Array<{ nodeId: string; generation: number; spec: Record<string, unknown> }>> {
  const { rows } = await sql<{ id: string; spec: Record<string, unknown>; spec_generation: string }>`
    SELECT id, spec, spec_generation FROM nodes
    WHERE session_gateway = ${gatewayId} AND spec_generation > COALESCE(observed_generation, 0)`.execute(db);
  return rows.map((r) => ({ nodeId: r.id, generation: Number(r.spec_generation), spec: r.spec }));
}

/** What one heartbeat flush did. */
export interface RecordedHeartbeats {
  /** Nodes the database had lost (unreachable or on no/another gateway), connected again. */
  revived: string[];
  /** Heard nodes whose row another transaction held: nothing written, for the next flush. */
  deferred: SessionFence[];
}

/**
 * Records one flush of heartbeats heard by `gatewayId`, in the caller's transaction: each node
 * still at the heard epoch gets `last_heartbeat_at` and is connected on this gateway. A node the
 * database wrongly thought silent (another gateway's sweep during a pause, a moved clock) is
 * connected again and loses `NodeUnreachable`; those are answered as `revived`.
 *
 * Never waits for a node's row lock, so it can take no part in a deadlock: rows are locked in id
 * order `FOR NO KEY UPDATE SKIP LOCKED` (the lock an UPDATE of non-key columns takes anyway, which
 * lets inserts of rows referencing the node through), and a heard node whose row another
 * transaction holds (the liveness sweep, a session opening, a rollout step enqueuing commands to
 * many nodes in its own order) is answered as `deferred`, still at its epoch, for the caller's next
 * flush. A node fenced by a newer epoch is neither. Whether a node was lost is read from the row
 * as locked: a sweep that committed before this locked it counts. Idempotent.
 */
export async function recordHeartbeats(
  trx: Trx,
  gatewayId: string,
  heard: ReadonlyArray<SessionFence>,
): Promise<RecordedHeartbeats> {
  if (heard.length === 0) return { revived: [], deferred: [] };
  const { rows } = await sql<{ id: string; epoch: string; was_lost: boolean; deferred: boolean }>`
    WITH heard AS (
      SELECT * FROM unnest(${heard.map((h) => h.nodeId)}::text[], ${heard.map((h) => h.epoch)}::bigint[])
        AS t(id, epoch)
    ), locked AS (
      SELECT n.id, (n.connectivity <> 'connected' OR n.session_gateway IS DISTINCT FROM ${gatewayId}) AS was_lost
      FROM nodes n JOIN heard t ON n.id = t.id AND n.epoch = t.epoch
      ORDER BY n.id FOR NO KEY UPDATE OF n SKIP LOCKED
    ), written AS (
      UPDATE nodes n SET last_heartbeat_at = compute_now(), connectivity = 'connected',
        session_gateway = ${gatewayId}
      FROM locked WHERE n.id = locked.id
      RETURNING n.id, n.epoch, locked.was_lost
    )
    SELECT id, epoch, was_lost, false AS deferred FROM written
    UNION ALL
    SELECT t.id, t.epoch, false, true FROM heard t
    WHERE NOT EXISTS (SELECT 1 FROM locked l WHERE l.id = t.id)
      AND EXISTS (SELECT 1 FROM nodes n WHERE n.id = t.id AND n.epoch = t.epoch)`.execute(trx);
  const revived = rows.filter((r) => !r.deferred && r.was_lost).map((r) => r.id);
  if (revived.length > 0) {
    await trx
      .deleteFrom('node_conditions')
      .where('node_id', 'in', revived)
      .where('type', '=', 'NodeUnreachable')
      .execute();
  }
  const deferred = rows.filter((r) => r.deferred).map((r) => ({ nodeId: r.id, epoch: Number(r.epoch) }));
  return { revived, deferred };
}

/**
 * Sessions whose liveness lease lapsed, all in one statement: each node becomes unreachable with
 * `NodeUnreachable` (nothing it holds is released), only while its session still holds the node's
 * epoch. Rows are locked in id order (as the sweep and the heartbeat flush lock them). Answers the
 * node ids marked (none for fenced sessions).
 */
export async function markSessionsUnreachable(trx: Trx, fences: readonly SessionFence[]): Promise<string[]> {
  if (fences.length === 0) return [];
  const { rows } = await sql<{ id: string }>`
    WITH lapsed AS (
      SELECT n.id FROM nodes n
      JOIN unnest(${fences.map((f) => f.nodeId)}::text[], ${fences.map((f) => f.epoch)}::bigint[]) AS t(id, epoch)
        ON n.id = t.id AND n.epoch = t.epoch
      ORDER BY n.id FOR NO KEY UPDATE OF n
    )
    UPDATE nodes SET connectivity = 'unreachable', session_gateway = NULL, updated_at = compute_now()
    FROM lapsed WHERE nodes.id = lapsed.id
    RETURNING nodes.id`.execute(trx);
  return raiseUnreachable(
    trx,
    rows.map((r) => r.id),
  );
}

/**
 * Nodes whose heartbeats reached no gateway for a whole lease (by `compute_now()`) become
 * unreachable with `NodeUnreachable`; nothing they hold is released. Never waits for a node's row
 * lock (so, like the heartbeat flush, it takes no part in a deadlock): rows another transaction
 * holds (a flush writing their heartbeat, a session opening) are skipped, the next sweep sees them.
 * Answers the node ids marked.
 */
export async function markSilentNodesUnreachable(trx: Trx, leaseSeconds: number): Promise<string[]> {
  const { rows } = await sql<{ id: string }>`
    WITH stale AS (
      SELECT id FROM nodes
      WHERE connectivity = 'connected'
        AND (last_heartbeat_at IS NULL OR last_heartbeat_at < compute_now() - make_interval(secs => ${leaseSeconds}))
      ORDER BY id FOR NO KEY UPDATE SKIP LOCKED
    )
    UPDATE nodes SET connectivity = 'unreachable', session_gateway = NULL, updated_at = compute_now()
    FROM stale WHERE nodes.id = stale.id
    RETURNING nodes.id`.execute(trx);
  return raiseUnreachable(
    trx,
    rows.map((r) => r.id),
  );
}

async function raiseUnreachable(trx: Trx, nodeIds: string[]): Promise<string[]> {
  if (nodeIds.length === 0) return nodeIds;
  await sql`
    INSERT INTO node_conditions (node_id, type, reason, message, effect)
    SELECT id, 'NodeUnreachable', 'Unreachable', 'no heartbeat within the liveness lease', 'NoSchedule'
    FROM unnest(${nodeIds}::text[]) AS id
    ON CONFLICT (node_id, type) DO UPDATE SET updated_at = compute_now()`.execute(trx);
  return nodeIds;
}
