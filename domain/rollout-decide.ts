import { assertNever } from './errors.ts';
import { type EffectiveDisruption, failureThreshold } from './rollout-policy.ts';
import {
  isNodeInProgress,
  type RolloutAbortMode,
  type RolloutNodeState,
  type RolloutRequest,
  type RolloutState,
} from './rollout-states.ts';

/**
 * A rollout's rules as a pure function of a snapshot (`decideRollout`): the workflow reads the
 * snapshot, applies the decision in one transaction and waits. Per node, the health gate: the node
 * reconnects on the release's version with a newer session epoch, reports healthy in that epoch,
 * and stays so for the soak; a refused command, a `rolled-back` or `unhealthy` report, leaving the
 * gate during the soak, or not coming back within the gate timeout fails it. Per wave: pause when
 * its unacknowledged failures reach the threshold, move on when every node is settled. Starts stay
 * within each pool's budget, idle nodes first; aborting with rollback rolls back in reverse waves.
 */

export interface ObservedNode {
  agentVersion: string | null;
  epoch: number;
  connectivity: string;
  provisionState: string;
  role: string;
  /** `healthy`/`unhealthy` as bcd last reported it, in session epoch `healthEpoch`. */
  health: string | null;
  healthEpoch: number | null;
  /** bcd's last update report (`rolled-back`, …), with the epoch it came in. */
  report: { state: string; releaseId: string | null; message: string; epoch: number } | null;
  activeAllocations: number;
}

export interface RolloutNodeSnapshot {
  nodeId: string;
  name: string;
  poolId: string;
  wave: number;
  position: number;
  state: RolloutNodeState;
  fromVersion: string | null;
  startEpoch: number | null;
  startedAtMs: number | null;
  healthySinceMs: number | null;
  acknowledged: boolean;
  reason: string | null;
  command: { state: string; error: string | null } | null;
  node: ObservedNode;
}

export interface RolloutSnapshot {
  id: string;
  releaseId: string;
  targetVersion: string;
  releaseExpiresAtMs: number;
  state: RolloutState;
  currentWave: number;
  waveCount: number;
  pauseReason: string | null;
  abortMode: RolloutAbortMode | null;
  rollbackDone: boolean;
  nodes: RolloutNodeSnapshot[];
  /** Each pool's budget, and its nodes in progress in other rollouts. */
  pools: Record<string, EffectiveDisruption & { inUseElsewhere: number }>;
  nowMs: number;
}

export type RolloutEvent =
  | { type: 'rollout.wave-started'; wave: number; nodes: number }
  | { type: 'rollout.node-updating'; nodeId: string; poolId: string; wave: number }
  | { type: 'rollout.node-updated'; nodeId: string; poolId: string; wave: number }
  | { type: 'rollout.node-failed'; nodeId: string; poolId: string; wave: number; reason: string }
  | { type: 'rollout.node-skipped'; nodeId: string; poolId: string; wave: number; reason: string }
  | { type: 'rollout.node-rolling-back'; nodeId: string; poolId: string; wave: number }
  | { type: 'rollout.node-rolled-back'; nodeId: string; poolId: string; wave: number }
  | {
      type: 'rollout.paused';
      wave: number;
      reason: string;
      failures: Array<{ nodeId: string; reason: string }>;
    }
  | { type: 'rollout.resumed'; wave: number }
  | { type: 'rollout.aborted'; wave: number; rollback: boolean }
  | { type: 'rollout.completed'; wave: number }
  | { type: 'rollout.rolled-back'; wave: number };

export interface NodeChange {
  nodeId: string;
  state: RolloutNodeState;
  reason?: string;
  healthySinceMs?: number | null;
  acknowledged?: boolean;
  /** Start an update (`update`) or a rollback (`rollback`): a command and the epoch it starts from. */
  start?: 'update' | 'rollback';
}

export interface RolloutDecision {
  state: RolloutState;
  currentWave: number;
  pauseReason: string | null;
  abortMode: RolloutAbortMode | null;
  rollbackDone: boolean;
  changes: NodeChange[];
  events: RolloutEvent[];
  /** Nothing is left to do: the workflow ends. */
  finished: boolean;
  /** Nodes still counting against a budget (the workflow polls while any do). */
  inProgress: number;
}

const settled: readonly RolloutNodeState[] = ['done', 'failed', 'skipped', 'rolled-back'];

/** The gate's verdict on one node being updated or rolled back (null: no change). */
function gate(
  n: RolloutNodeSnapshot,
  s: RolloutSnapshot,
  budget: EffectiveDisruption,
): Omit<NodeChange, 'nodeId'> | null {
  const { node } = n;
  const startEpoch = n.startEpoch ?? 0;
  const elapsed = s.nowMs - (n.startedAtMs ?? s.nowMs);
  const commandFailed = n.command && ['failed', 'expired', 'cancelled'].includes(n.command.state);
  if (n.state === 'rolling-back') {
    if (commandFailed)
      return { state: 'failed', reason: `bcd refused the rollback: ${n.command?.error ?? ''}` };
    if (node.agentVersion === n.fromVersion && node.epoch > startEpoch && node.connectivity === 'connected') {
      return { state: 'rolled-back' };
    }
    if (elapsed > budget.gateTimeoutMs)
      return { state: 'failed', reason: `did not come back on ${n.fromVersion} in time` };
    return null;
  }
  if (commandFailed) {
    return { state: 'failed', reason: `bcd refused the update: ${n.command?.error || n.command?.state}` };
  }
  const report = node.report;
  if (
    report &&
    report.epoch > startEpoch &&
    report.state === 'rolled-back' &&
    report.releaseId === s.releaseId
  ) {
    return { state: 'failed', reason: `bcd rolled back by itself: ${report.message}` };
  }
  if (node.health === 'unhealthy' && (node.healthEpoch ?? 0) > startEpoch) {
    return { state: 'failed', reason: 'reported unhealthy on the new version (bcd rolls back by itself)' };
  }
  const onGate =
    node.agentVersion === s.targetVersion &&
    node.epoch > startEpoch &&
    node.connectivity === 'connected' &&
    node.health === 'healthy' &&
    node.healthEpoch === node.epoch;
  if (n.state === 'updating') {
    if (onGate) {
      return budget.soakMs <= 0 ? { state: 'done' } : { state: 'soaking', healthySinceMs: s.nowMs };
    }
    if (elapsed > budget.gateTimeoutMs) {
      return {
        state: 'failed',
        reason: `did not come back healthy on ${s.targetVersion} within ${Math.round(budget.gateTimeoutMs / 1000)} s`,
      };
    }
    return null;
  }
  // soaking
  if (!onGate) {
    const why =
      node.connectivity !== 'connected'
        ? 'lost its session'
        : node.agentVersion !== s.targetVersion
          ? `runs ${node.agentVersion} again`
          : node.epoch !== node.healthEpoch
            ? 'reconnected without reporting healthy'
            : 'stopped reporting healthy';
    return { state: 'failed', reason: `left the health gate during the soak: ${why}` };
  }
  if (s.nowMs - (n.healthySinceMs ?? s.nowMs) >= budget.soakMs) return { state: 'done' };
  return null;
}

/** Why a node cannot be updated now (it is then skipped), or null. */
function ineligible(n: RolloutNodeSnapshot, budget: EffectiveDisruption): string | null {
  const { node } = n;
  if (node.provisionState === 'retired') return 'retired';
  if (!['ready', 'deployed'].includes(node.provisionState)) {
    return `in provision state ${node.provisionState} (a node in a metal workflow is never updated)`;
  }
  if (node.activeAllocations > 0 && !budget.allowActiveReservations) {
    return 'has active reservations and the pool’s disruption policy forbids restarting bcd under them';
  }
  return null;
}

/**
 * Decides one step of a rollout from its snapshot and at most one operator request. Idempotent: the
 * same snapshot decides the same; applying a decision and deciding again changes nothing more
 * until time passes or a node moves.
 */
export function decideRollout(s: RolloutSnapshot, request: RolloutRequest | null): RolloutDecision {
  const d: RolloutDecision = {
    state: s.state,
    currentWave: s.currentWave,
    pauseReason: s.state === 'paused' ? s.pauseReason : null,
    abortMode: s.abortMode,
    rollbackDone: s.rollbackDone,
    changes: [],
    events: [],
    finished: false,
    inProgress: 0,
  };
  const nodes = s.nodes.map((n) => ({ ...n }));
  const change = (n: RolloutNodeSnapshot, c: Omit<NodeChange, 'nodeId'>) => {
    n.state = c.state;
    if (c.reason !== undefined) n.reason = c.reason;
    if (c.healthySinceMs !== undefined) n.healthySinceMs = c.healthySinceMs;
    d.changes.push({ nodeId: n.nodeId, ...c });
    const at = { nodeId: n.nodeId, poolId: n.poolId, wave: n.wave };
    if (c.start === 'update') d.events.push({ type: 'rollout.node-updating', ...at });
    if (c.start === 'rollback') d.events.push({ type: 'rollout.node-rolling-back', ...at });
    if (c.state === 'done') d.events.push({ type: 'rollout.node-updated', ...at });
    if (c.state === 'rolled-back') d.events.push({ type: 'rollout.node-rolled-back', ...at });
    if (c.state === 'failed') d.events.push({ type: 'rollout.node-failed', ...at, reason: c.reason ?? '' });
    if (c.state === 'skipped') d.events.push({ type: 'rollout.node-skipped', ...at, reason: c.reason ?? '' });
  };

  if (request) {
    switch (request.kind) {
      case 'pause':
        if (d.state === 'running') {
          d.state = 'paused';
          d.pauseReason = request.reason ?? 'paused by an operator';
          d.events.push({ type: 'rollout.paused', wave: d.currentWave, reason: d.pauseReason, failures: [] });
        }
        break;
      case 'resume':
        if (d.state === 'paused') {
          d.state = 'running';
          d.pauseReason = null;
          for (const n of nodes) {
            if (n.wave === d.currentWave && n.state === 'failed' && !n.acknowledged) {
              n.acknowledged = true;
              d.changes.push({ nodeId: n.nodeId, state: 'failed', acknowledged: true });
            }
          }
          d.events.push({ type: 'rollout.resumed', wave: d.currentWave });
        }
        break;
      case 'abort':
        if (d.state === 'running' || d.state === 'paused') {
          d.state = 'aborted';
          d.abortMode = request.rollback ? 'rollback' : 'stop';
          d.events.push({ type: 'rollout.aborted', wave: d.currentWave, rollback: request.rollback });
        } else if (d.state === 'aborted' && request.rollback && d.abortMode === 'stop') {
          d.abortMode = 'rollback';
          d.rollbackDone = false;
          d.events.push({ type: 'rollout.aborted', wave: d.currentWave, rollback: true });
        }
        break;
      default:
        assertNever(request);
    }
  }

  // The gate, for every node in progress, whatever the rollout's state.
  for (const n of nodes) {
    if (!isNodeInProgress(n.state)) continue;
    const verdict = gate(n, s, s.pools[n.poolId]!);
    if (verdict) change(n, verdict);
  }

  const inUse = new Map<string, number>();
  for (const [poolId, p] of Object.entries(s.pools)) inUse.set(poolId, p.inUseElsewhere);
  for (const n of nodes) if (isNodeInProgress(n.state)) inUse.set(n.poolId, (inUse.get(n.poolId) ?? 0) + 1);
  const hasRoom = (poolId: string) => (inUse.get(poolId) ?? 0) < s.pools[poolId]!.maxUpdating;
  const take = (poolId: string) => inUse.set(poolId, (inUse.get(poolId) ?? 0) + 1);

  if (d.state === 'running') {
    // Waves advance while settled; a wave that reached its failure threshold pauses the rollout.
    for (;;) {
      const wave = nodes.filter((n) => n.wave === d.currentWave);
      const failures = wave.filter((n) => n.state === 'failed' && !n.acknowledged);
      if (failures.length > 0 && failures.length >= failureThreshold(wave.length)) {
        d.state = 'paused';
        d.pauseReason = `${failures.length} of ${wave.length} node(s) of wave ${d.currentWave + 1} failed the health gate (threshold ${failureThreshold(wave.length)})`;
        d.events.push({
          type: 'rollout.paused',
          wave: d.currentWave,
          reason: d.pauseReason,
          failures: failures.map((f) => ({
            nodeId: f.nodeId,
            reason: f.reason ?? 'failed',
          })),
        });
        break;
      }
      if (s.nowMs >= s.releaseExpiresAtMs) {
        d.state = 'paused';
        d.pauseReason =
          'the release expired: no node is started on it (abort, and roll out a newly signed release)';
        d.events.push({ type: 'rollout.paused', wave: d.currentWave, reason: d.pauseReason, failures: [] });
        break;
      }
      // Idle nodes first, then nodes whose reservations tolerate a bcd restart; then by position.
      const pending = wave
        .filter((n) => n.state === 'pending')
        .sort(
          (a, b) =>
            Number(a.node.activeAllocations > 0) - Number(b.node.activeAllocations > 0) ||
            a.position - b.position,
        );
      // A node that is not connected waits (it may be reconnecting) until it is all the wave has left.
      const onlyUnreachableLeft = wave.every(
        (n) => settled.includes(n.state) || (n.state === 'pending' && n.node.connectivity !== 'connected'),
      );
      for (const n of pending) {
        const budget = s.pools[n.poolId]!;
        if (n.node.agentVersion === s.targetVersion) {
          change(n, { state: 'done', reason: `already runs ${s.targetVersion}` });
          continue;
        }
        const why = ineligible(n, budget);
        if (why) {
          change(n, { state: 'skipped', reason: why });
          continue;
        }
        if (n.node.connectivity !== 'connected') {
          if (onlyUnreachableLeft)
            change(n, { state: 'skipped', reason: `not connected (${n.node.connectivity})` });
          continue;
        }
        if (!hasRoom(n.poolId)) continue;
        take(n.poolId);
        change(n, { state: 'updating', start: 'update', healthySinceMs: null });
      }
      if (!wave.every((n) => settled.includes(n.state))) break;
      if (d.currentWave + 1 >= s.waveCount) {
        d.state = 'completed';
        d.events.push({ type: 'rollout.completed', wave: d.currentWave });
        break;
      }
      d.currentWave++;
      d.events.push({
        type: 'rollout.wave-started',
        wave: d.currentWave,
        nodes: nodes.filter((n) => n.wave === d.currentWave).length,
      });
    }
  }

  if (d.state === 'aborted' && d.abortMode === 'rollback' && !d.rollbackDone) {
    // Reverse waves: the latest wave with nodes on the release goes back first, within budgets.
    const busy = nodes.some((n) => n.state === 'updating' || n.state === 'soaking');
    if (!busy) {
      const onRelease = nodes.filter(
        (n) =>
          (n.state === 'done' || n.state === 'failed') &&
          n.node.agentVersion === s.targetVersion &&
          n.fromVersion !== null,
      );
      const rollingBack = nodes.some((n) => n.state === 'rolling-back');
      if (onRelease.length === 0 && !rollingBack) {
        d.rollbackDone = true;
        d.events.push({ type: 'rollout.rolled-back', wave: d.currentWave });
      } else if (onRelease.length > 0) {
        const latest = Math.max(...onRelease.map((n) => n.wave));
        const inFlightWave = Math.max(
          -1,
          ...nodes.filter((n) => n.state === 'rolling-back').map((n) => n.wave),
        );
        if (inFlightWave <= latest) {
          for (const n of onRelease
            .filter((x) => x.wave === latest)
            .sort((a, b) => b.position - a.position)) {
            if (n.node.connectivity !== 'connected' || !hasRoom(n.poolId)) continue;
            take(n.poolId);
            change(n, { state: 'rolling-back', start: 'rollback' });
          }
        }
      }
    }
  }

  d.inProgress = nodes.filter((n) => isNodeInProgress(n.state)).length;
  d.finished =
    d.inProgress === 0 &&
    (d.state === 'completed' || (d.state === 'aborted' && (d.abortMode === 'stop' || d.rollbackDone)));
  if (d.state !== 'paused') d.pauseReason = null;
  return d;
}
