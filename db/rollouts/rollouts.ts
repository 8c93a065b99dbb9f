import { type Selectable, sql, type Transaction } from 'kysely';
import type { Database, Db, RolloutsTable } from '../../core/database.ts';
import { ComputeError } from '../../domain/errors.ts';
import { newId } from '../../domain/ids.ts';
import { planWaveSizes } from '../../domain/rollout-policy.ts';
import type { RolloutAbortMode, RolloutNodeState, RolloutState } from '../../domain/rollout-states.ts';

type Trx = Transaction<Database>;

export interface RolloutSelector {
  poolIds?: string[] | undefined;
  labels?: Record<string, string> | undefined;
}

export interface RolloutRow {
  id: string;
  releaseId: string;
  createdBy: string;
  selector: RolloutSelector;
  waves: number[];
  state: RolloutState;
  currentWave: number;
  pauseReason: string | null;
  abortMode: RolloutAbortMode | null;
  rollbackDone: boolean;
  requestHash: string;
  createdAt: Date;
  updatedAt: Date;
  finishedAt: Date | null;
}

export function rolloutRow(row: Selectable<RolloutsTable>): RolloutRow {
  return {
    id: row.id,
    releaseId: row.release_id,
    createdBy: row.created_by,
    selector: row.selector as RolloutSelector,
    waves: row.waves,
    state: row.state,
    currentWave: row.current_wave,
    pauseReason: row.pause_reason,
    abortMode: row.abort_mode,
    rollbackDone: row.rollback_done,
    requestHash: row.request_hash,
    createdAt: row.created_at,
    updatedAt: row.updated_at,
    finishedAt: row.finished_at,
  };
}

/**
 * The nodes a selector picks: daemons (`node`, `node-tenant`) not retired, in any of `poolIds`
 * and carrying every label of `labels`, in a stable order (pool, name).
 */
export async function selectRolloutCandidates(
  db: Db | Trx,
  selector: RolloutSelector,
): Promise<Array<{ id: string; poolId: string }>> {
  let query = db
    .selectFrom('nodes')
    .select(['id', 'pool_id'])
    .where('pool_id', 'is not', null)
    .where('role', 'in', ['node', 'node-tenant'])
    .where('provision_state', '!=', 'retired');
  if (selector.poolIds?.length) query = query.where('pool_id', 'in', selector.poolIds);
  for (const [key, value] of Object.entries(selector.labels ?? {})) {
    query = query.where((eb) =>
      eb.exists(
        eb
          .selectFrom('node_labels as l')
          .select('l.node_id')
          .whereRef('l.node_id', '=', 'nodes.id')
          .where('l.key', '=', key)
          .where('l.value', '=', value),
      ),
    );
  }
  const rows = await query.orderBy('pool_id').orderBy('name').execute();
  return rows.map((r) => ({ id: r.id, poolId: r.pool_id! }));
}

/**
 * Creates a rollout and places each selected node in its wave, in one transaction. Idempotent by
 * (`createdBy`, `idempotencyKey`): the same key with the same request answers the stored rollout
 * (`created: false`), with another request CONFLICT. CONFLICT too while another rollout runs or is
 * paused; INVALID_STATE for an expired release; INVALID_INPUT when the selector picks no node.
 * Nodes are spread over waves round-robin by pool, so every wave samples every pool it can.
 */
export async function insertRollout(
  db: Db,
  input: {
    releaseId: string;
    createdBy: string;
    idempotencyKey: string;
    requestHash: string;
    selector: RolloutSelector;
    waves: number[];
  },
): Promise<{ rollout: RolloutRow; created: boolean }> {
  return db.transaction().execute(async (trx) => {
    const existing = await trx
      .selectFrom('rollouts')
      .selectAll()
      .where('created_by', '=', input.createdBy)
      .where('idempotency_key', '=', input.idempotencyKey)
      .executeTakeFirst();
    if (existing) {
      if (existing.request_hash !== input.requestHash) {
        throw new ComputeError(
          'CONFLICT',
          `idempotency key ${input.idempotencyKey} was used for another rollout request: use a new key`,
          { rolloutId: existing.id },
        );
      }
      return { rollout: rolloutRow(existing), created: false };
    }
    // One rollout at a time: two would move the same nodes and share the same budgets.
    await sql`SELECT pg_advisory_xact_lock(hashtext('rollouts:create'))`.execute(trx);
    const active = await trx
      .selectFrom('rollouts')
      .select(['id', 'state'])
      .where('state', 'in', ['running', 'paused'])
      .executeTakeFirst();
    if (active) {
      throw new ComputeError(
        'CONFLICT',
        `rollout ${active.id} is ${active.state}: finish or abort it before starting another`,
        { rolloutId: active.id },
      );
    }
    const release = await trx
      .selectFrom('releases')
      .select(['version', 'expires_at'])
      .where('id', '=', input.releaseId)
      .where('expires_at', '<=', sql<Date>`compute_now()`)
      .executeTakeFirst();
    if (release) {
      throw new ComputeError(
        'INVALID_STATE',
        `release ${release.version} expired at ${release.expires_at.toISOString()}: publish a newly signed release`,
      );
    }
    const candidates = await selectRolloutCandidates(trx, input.selector);
    if (candidates.length === 0) {
      throw new ComputeError('INVALID_INPUT', 'selector: no node matches (check poolIds and labels)', {
        field: 'selector',
      });
    }
    // Round-robin by pool, so the first waves sample every pool.
    const byPool = new Map<string, string[]>();
    for (const c of candidates) byPool.set(c.poolId, [...(byPool.get(c.poolId) ?? []), c.id]);
    const order: Array<{ id: string; poolId: string }> = [];
    for (let i = 0; order.length < candidates.length; i++) {
      for (const [poolId, ids] of byPool) if (ids[i]) order.push({ id: ids[i]!, poolId });
    }
    const sizes = planWaveSizes(order.length, input.waves);
    const id = newId('roll');
    const row = await trx
      .insertInto('rollouts')
      .values({
        id,
        release_id: input.releaseId,
        created_by: input.createdBy,
        idempotency_key: input.idempotencyKey,
        request_hash: input.requestHash,
        selector: JSON.stringify(input.selector),
        waves: JSON.stringify(input.waves),
      })
      .returningAll()
      .executeTakeFirstOrThrow();
    let position = 0;
    const values = sizes.flatMap((size, wave) =>
      Array.from({ length: size }, () => {
        const node = order[position]!;
        return { rollout_id: id, node_id: node.id, pool_id: node.poolId, wave, position: position++ };
      }),
    );
    for (let i = 0; i < values.length; i += 1000) {
      await trx
        .insertInto('rollout_nodes')
        .values(values.slice(i, i + 1000))
        .execute();
    }
    return { rollout: rolloutRow(row), created: true };
  });
}

export async function findRollout(db: Db | Trx, id: string): Promise<RolloutRow | null> {
  const row = await db.selectFrom('rollouts').selectAll().where('id', '=', id).executeTakeFirst();
  return row ? rolloutRow(row) : null;
}

/** NOT_FOUND unless the rollout exists. */
export async function requireRollout(db: Db | Trx, id: string): Promise<RolloutRow> {
  const rollout = await findRollout(db, id);
  if (!rollout) throw new ComputeError('NOT_FOUND', `rollout ${id} not found (rollouts.list shows them)`);
  return rollout;
}

/**
 * The ids of rollouts still running or paused, created more than `graceMs` ago (oldest first, at
 * most `limit`): each must have its workflow, which the orphan sweeper makes sure of.
 */
export async function findLiveRolloutIds(
  db: Db,
  input: { graceMs: number; limit: number },
): Promise<string[]> {
  const rows = await db
    .selectFrom('rollouts')
    .select('id')
    .where('state', 'in', ['running', 'paused'])
    .where('created_at', '<', sql<Date>`compute_now() - make_interval(secs => ${input.graceMs / 1000})`)
    .orderBy('created_at')
    .limit(input.limit)
    .execute();
  return rows.map((r) => r.id);
}

/** Rollouts newest first, optionally in one state. */
export async function listRollouts(
  db: Db,
  input: { state?: RolloutState | undefined; limit: number },
): Promise<RolloutRow[]> {
  let query = db.selectFrom('rollouts').selectAll().orderBy('created_at', 'desc').orderBy('id', 'desc');
  if (input.state) query = query.where('state', '=', input.state);
  return (await query.limit(input.limit).execute()).map(rolloutRow);
}

export interface RolloutNodeRow {
  nodeId: string;
  nodeName: string;
  poolId: string;
  wave: number;
  position: number;
  state: RolloutNodeState;
  fromVersion: string | null;
  agentVersion: string | null;
  reason: string | null;
  acknowledged: boolean;
  startedAt: Date | null;
  finishedAt: Date | null;
}

/** A rollout's nodes by wave and position, with the version each runs now. */
export async function listRolloutNodes(db: Db | Trx, rolloutId: string): Promise<RolloutNodeRow[]> {
  const rows = await db
    .selectFrom('rollout_nodes as r')
    .innerJoin('nodes as n', 'n.id', 'r.node_id')
    .select([
      'r.node_id',
      'n.name',
      'r.pool_id',
      'r.wave',
      'r.position',
      'r.state',
      'r.from_version',
      'n.agent_version',
      'r.reason',
      'r.acknowledged',
      'r.started_at',
      'r.finished_at',
    ])
    .where('r.rollout_id', '=', rolloutId)
    .orderBy('r.wave')
    .orderBy('r.position')
    .execute();
  return rows.map((r) => ({
    nodeId: r.node_id,
    nodeName: r.name,
    poolId: r.pool_id,
    wave: r.wave,
    position: r.position,
    state: r.state,
    fromVersion: r.from_version,
    agentVersion: r.agent_version,
    reason: r.reason,
    acknowledged: r.acknowledged,
    startedAt: r.started_at,
    finishedAt: r.finished_at,
  }));
}

/** Each pool's nodes in progress (updating, soaking, rolling back) across every rollout. */
export async function countInProgressByPool(db: Db | Trx, poolIds: string[]): Promise<Map<string, number>> {
  if (poolIds.length === 0) return new Map();
  const { rows } = await sql<{ pool_id: string; n: string }>`
    SELECT pool_id, count(*) AS n FROM rollout_nodes
    WHERE pool_id = ANY(${poolIds}) AND state IN ('updating', 'soaking', 'rolling-back')
    GROUP BY pool_id`.execute(db);
  return new Map(rows.map((r) => [r.pool_id, Number(r.n)]));
}
