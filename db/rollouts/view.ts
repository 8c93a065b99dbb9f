import { sql } from 'kysely';
import type { Db } from '../../core/database.ts';
import { effectiveDisruption, planWaveSizes } from '../../domain/rollout-policy.ts';
import { isNodeInProgress } from '../../domain/rollout-states.ts';
import { findRelease } from '../releases/releases.ts';
import { listRolloutNodes, type RolloutNodeRow, type RolloutRow } from './rollouts.ts';

export interface WaveProgress {
  index: number;
  /** The cumulative share of the selected nodes this wave reaches. */
  percent: number;
  nodes: number;
  pending: number;
  inProgress: number;
  done: number;
  failed: number;
  skipped: number;
  rolledBack: number;
  failures: Array<{
    nodeId: string;
    name: string;
    reason: string | null;
    rolledBack: boolean;
    acknowledged: boolean;
  }>;
}

export interface PoolBudgetUse {
  poolId: string;
  maxUpdating: number;
  inUse: number;
  soakSeconds: number;
}

export interface RolloutProgress {
  version: string | null;
  waves: WaveProgress[];
  budgets: PoolBudgetUse[];
  nodes: RolloutNodeRow[];
}

/**
 * A rollout's progress: per wave its nodes pending, in progress, done, failed (with why and whether
 * bcd is back on its previous version), skipped and rolled back; per pool its budget and the nodes
 * of every rollout counting against it now.
 */
export async function rolloutProgress(db: Db, rollout: RolloutRow): Promise<RolloutProgress> {
  const nodes = await listRolloutNodes(db, rollout.id);
  const release = await findRelease(db, rollout.releaseId);
  const waveCount = nodes.reduce((m, n) => Math.max(m, n.wave + 1), 0);
  const sizes = planWaveSizes(nodes.length, rollout.waves);
  const percents: number[] = [];
  let covered = 0;
  for (const size of sizes) {
    covered += size;
    percents.push(Math.round((covered / Math.max(1, nodes.length)) * 1000) / 10);
  }
  const waves: WaveProgress[] = Array.from({ length: waveCount }, (_, index) => {
    const of = nodes.filter((n) => n.wave === index);
    const count = (states: string[]) => of.filter((n) => states.includes(n.state)).length;
    return {
      index,
      percent: percents[index] ?? 100,
      nodes: of.length,
      pending: count(['pending']),
      inProgress: of.filter((n) => isNodeInProgress(n.state)).length,
      done: count(['done']),
      failed: count(['failed']),
      skipped: count(['skipped']),
      rolledBack: count(['rolled-back']),
      failures: of
        .filter((n) => n.state === 'failed')
        .map((n) => ({
          nodeId: n.nodeId,
          name: n.nodeName,
          reason: n.reason,
          rolledBack: n.fromVersion !== null && n.agentVersion === n.fromVersion,
          acknowledged: n.acknowledged,
        })),
    };
  });
  const poolIds = [...new Set(nodes.map((n) => n.poolId))];
  const { rows } = poolIds.length
    ? await sql<{ id: string; policy: Record<string, unknown>; nodes: string; in_use: string }>`
        SELECT p.id, p.policy,
          (SELECT count(*) FROM nodes n WHERE n.pool_id = p.id AND n.provision_state <> 'retired') AS nodes,
          (SELECT count(*) FROM rollout_nodes r WHERE r.pool_id = p.id
            AND r.state IN ('updating', 'soaking', 'rolling-back')) AS in_use
        FROM pools p WHERE p.id = ANY(${poolIds}) ORDER BY p.id`.execute(db)
    : { rows: [] };
  const budgets = rows.map((p) => {
    const d = effectiveDisruption(p.policy, Number(p.nodes));
    return {
      poolId: p.id,
      maxUpdating: d.maxUpdating,
      inUse: Number(p.in_use),
      soakSeconds: d.soakMs / 1000,
    };
  });
  return { version: release?.version ?? null, waves, budgets, nodes };
}
