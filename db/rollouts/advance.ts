import { sql, type Transaction } from 'kysely';
import type { Database, Db } from '../../core/database.ts';
import { ComputeError } from '../../domain/errors.ts';
import type { EventType } from '../../domain/event-types.ts';
import { decideRollout, type RolloutDecision, type RolloutSnapshot } from '../../domain/rollout-decide.ts';
import { effectiveDisruption } from '../../domain/rollout-policy.ts';
import type { RolloutNodeState, RolloutRequest } from '../../domain/rollout-states.ts';
import { insertOutboxEvent } from '../events/outbox.ts';
import { enqueueNodeCommand } from '../nodes/commands.ts';
import { findRelease, findReleaseFiles } from '../releases/releases.ts';

type Trx = Transaction<Database>;

/**
 * Reads everything a rollout's next step depends on, under the rollout's row lock (so two
 * advances of one rollout never interleave): the rollout, its release, every node of it with what
 * the node runs and reported, its command, its active allocations and whether a metal workflow
 * holds it, and each pool's budget with the nodes other rollouts have in progress there.
 */
export async function loadRolloutSnapshot(trx: Trx, rolloutId: string): Promise<RolloutSnapshot> {
  const rollout = await trx
    .selectFrom('rollouts')
    .selectAll()
    .where('id', '=', rolloutId)
    .forUpdate()
    .executeTakeFirst();
  if (!rollout) throw new ComputeError('NOT_FOUND', `rollout ${rolloutId} not found`);
  const release = await findRelease(trx, rollout.release_id);
  if (!release) throw new ComputeError('NOT_FOUND', `release ${rollout.release_id} not found`);
  const { rows } = await sql<{
    node_id: string;
    name: string;
    pool_id: string;
    wave: number;
    position: number;
    state: RolloutNodeState;
    from_version: string | null;
    start_epoch: string | null;
    started_at: Date | null;
    healthy_since: Date | null;
    acknowledged: boolean;
    reason: string | null;
    command_state: string | null;
    command_error: string | null;
    agent_version: string | null;
    epoch: string;
    connectivity: string;
    provision_state: string;
    role: string;
    bcd_health: string | null;
    bcd_health_epoch: string | null;
    bcd_update_report: Record<string, unknown> | null;
    active_allocations: string;
    in_metal_workflow: boolean;
  }>`
    SELECT r.node_id, n.name, r.pool_id, r.wave, r.position, r.state, r.from_version, r.start_epoch,
      r.started_at, r.healthy_since, r.acknowledged, r.reason,
      c.state AS command_state, c.error AS command_error,
      n.agent_version, n.epoch, n.connectivity, n.provision_state, n.role, n.bcd_health,
      n.bcd_health_epoch, n.bcd_update_report,
      (SELECT count(*) FROM allocations a WHERE a.node_id = n.id AND a.state IN ('binding', 'bound')
        AND a.during @> compute_now()) AS active_allocations,
      EXISTS (SELECT 1 FROM metal_workflows m WHERE m.node_id = n.id AND m.state = 'running') AS in_metal_workflow
    FROM rollout_nodes r JOIN nodes n ON n.id = r.node_id
    LEFT JOIN node_commands c ON c.id = r.command_id
    WHERE r.rollout_id = ${rolloutId}
    ORDER BY r.wave, r.position`.execute(trx);
  const poolIds = [...new Set(rows.map((r) => r.pool_id))];
  const pools = await sql<{ id: string; policy: Record<string, unknown>; nodes: string; elsewhere: string }>`
    SELECT p.id, p.policy,
      (SELECT count(*) FROM nodes n WHERE n.pool_id = p.id AND n.provision_state <> 'retired') AS nodes,
      (SELECT count(*) FROM rollout_nodes r WHERE r.pool_id = p.id AND r.rollout_id <> ${rolloutId}
        AND r.state IN ('updating', 'soaking', 'rolling-back')) AS elsewhere
    FROM pools p WHERE p.id = ANY(${poolIds})`.execute(trx);
  const now = await sql<{ now: Date }>`SELECT compute_now() AS now`.execute(trx);
  const ms = (d: Date | null) => (d ? d.getTime() : null);
  return {
    id: rollout.id,
    releaseId: release.id,
    targetVersion: release.version,
    releaseExpiresAtMs: release.expiresAt.getTime(),
    state: rollout.state,
    currentWave: rollout.current_wave,
    waveCount: rows.reduce((max, r) => Math.max(max, r.wave + 1), 0),
    pauseReason: rollout.pause_reason,
    abortMode: rollout.abort_mode,
    rollbackDone: rollout.rollback_done,
    nowMs: now.rows[0]!.now.getTime(),
    pools: Object.fromEntries(
      pools.rows.map((p) => [
        p.id,
        { ...effectiveDisruption(p.policy, Number(p.nodes)), inUseElsewhere: Number(p.elsewhere) },
      ]),
    ),
    nodes: rows.map((r) => {
      const report = r.bcd_update_report;
      return {
        nodeId: r.node_id,
        name: r.name,
        poolId: r.pool_id,
        wave: r.wave,
        position: r.position,
        state: r.state,
        fromVersion: r.from_version,
        startEpoch: r.start_epoch === null ? null : Number(r.start_epoch),
        startedAtMs: ms(r.started_at),
        healthySinceMs: ms(r.healthy_since),
        acknowledged: r.acknowledged,
        reason: r.reason,
        command: r.command_state ? { state: r.command_state, error: r.command_error } : null,
        node: {
          agentVersion: r.agent_version,
          epoch: Number(r.epoch),
          connectivity: r.connectivity,
          // A node a metal workflow holds is never updated: it reads as in that workflow.
          provisionState: r.in_metal_workflow ? 'metal-workflow' : r.provision_state,
          role: r.role,
          health: r.bcd_health,
          healthEpoch: r.bcd_health_epoch === null ? null : Number(r.bcd_health_epoch),
          report: report
            ? {
                state: String(report.state ?? ''),
                releaseId: typeof report.releaseId === 'string' ? report.releaseId : null,
                message: String(report.message ?? ''),
                epoch: Number(report.epoch ?? 0),
              }
            : null,
          activeAllocations: Number(r.active_allocations),
        },
      };
    }),
  };
}

/** What the workflow learns from one advance. */
export interface AdvanceOutcome {
  state: RolloutDecision['state'];
  currentWave: number;
  waveCount: number;
  finished: boolean;
  inProgress: number;
  releaseId: string;
  /** How soon to look again while nodes are in their gate: a quarter of the shortest soak, 250 ms to 2 s. */
  pollMs: number;
}

/**
 * One step of a rollout in one transaction: the snapshot (under the rollout's lock), the decision
 * (`decideRollout`, with at most one operator request), and its effects: node states, a
 * `bcd.update` or `bcd.rollback` command per node started (with the epoch and version it starts
 * from), the rollout's state and wave, and every event in the outbox. Idempotent: a retried step
 * re-reads and decides again, and a node already started is never started twice.
 */
export async function advanceRollout(
  db: Db,
  input: { rolloutId: string; request: RolloutRequest | null },
): Promise<AdvanceOutcome> {
  return db.transaction().execute(async (trx) => {
    const snapshot = await loadRolloutSnapshot(trx, input.rolloutId);
    const decision = decideRollout(snapshot, input.request);
    const byId = new Map(snapshot.nodes.map((n) => [n.nodeId, n]));
    let updatePayload: Record<string, unknown> | null = null;
    for (const change of decision.changes) {
      const node = byId.get(change.nodeId)!;
      const budget = snapshot.pools[node.poolId]!;
      const terminal = ['done', 'failed', 'skipped', 'rolled-back'].includes(change.state);
      let command: { id: string } | null = null;
      if (change.start === 'update') {
        updatePayload ??= await updateCommandPayload(trx, snapshot.releaseId, budget.soakMs);
        command = await enqueueNodeCommand(trx, {
          nodeId: node.nodeId,
          kind: 'bcd.update',
          payload: { ...updatePayload, soakMs: budget.soakMs },
          notAfterSeconds: Math.ceil(budget.gateTimeoutMs / 1000),
        });
      }
      if (change.start === 'rollback') {
        command = await enqueueNodeCommand(trx, {
          nodeId: node.nodeId,
          kind: 'bcd.rollback',
          payload: { toVersion: node.fromVersion, reason: `rollout ${snapshot.id} aborted with rollback` },
          notAfterSeconds: Math.ceil(budget.gateTimeoutMs / 1000),
        });
      }
      await trx
        .updateTable('rollout_nodes')
        .set({
          state: change.state,
          ...(change.reason !== undefined ? { reason: change.reason } : {}),
          ...(change.acknowledged !== undefined ? { acknowledged: change.acknowledged } : {}),
          ...(change.healthySinceMs !== undefined
            ? { healthy_since: change.healthySinceMs === null ? null : new Date(change.healthySinceMs) }
            : {}),
          ...(command
            ? {
                command_id: command.id,
                start_epoch: node.node.epoch,
                started_at: sql<Date>`compute_now()`,
                finished_at: null,
                ...(change.start === 'update' ? { from_version: node.node.agentVersion } : {}),
              }
            : {}),
          ...(terminal && change.acknowledged === undefined ? { finished_at: sql<Date>`compute_now()` } : {}),
        })
        .where('rollout_id', '=', snapshot.id)
        .where('node_id', '=', change.nodeId)
        .execute();
      if (change.state === 'done') {
        await trx
          .updateTable('nodes')
          .set({ installed_release_id: snapshot.releaseId })
          .where('id', '=', change.nodeId)
          .execute();
      }
    }
    await trx
      .updateTable('rollouts')
      .set({
        state: decision.state,
        current_wave: decision.currentWave,
        pause_reason: decision.pauseReason,
        abort_mode: decision.abortMode,
        rollback_done: decision.rollbackDone,
        updated_at: sql<Date>`compute_now()`,
        ...(decision.finished ? { finished_at: sql<Date>`coalesce(finished_at, compute_now())` } : {}),
      })
      .where('id', '=', snapshot.id)
      .execute();
    for (const event of decision.events) {
      const { type, ...data } = event;
      await insertOutboxEvent(trx, {
        type: type as EventType,
        subject: `rollout/${snapshot.id}`,
        tenantId: null,
        data: { rolloutId: snapshot.id, releaseId: snapshot.releaseId, ...data },
      });
    }
    return {
      state: decision.state,
      currentWave: decision.currentWave,
      waveCount: snapshot.waveCount,
      finished: decision.finished,
      inProgress: decision.inProgress,
      releaseId: snapshot.releaseId,
      pollMs: Math.min(
        2_000,
        Math.max(250, Math.min(...Object.values(snapshot.pools).map((p) => p.soakMs / 4), 2_000)),
      ),
    };
  });
}

/** The `bcd.update` payload of a release: its manifest, signatures and files (base64). */
async function updateCommandPayload(
  trx: Trx,
  releaseId: string,
  soakMs: number,
): Promise<Record<string, unknown>> {
  const release = await findRelease(trx, releaseId);
  if (!release) throw new ComputeError('NOT_FOUND', `release ${releaseId} not found`);
  const files = await findReleaseFiles(trx, releaseId);
  return {
    releaseId,
    manifest: release.manifest,
    signatures: release.signatures,
    files: files.map((f) => ({ path: f.path, content: f.content.toString('base64') })),
    soakMs,
  };
}
