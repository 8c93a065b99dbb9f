import { sql } from 'kysely';
import { describe, expect, it } from 'vitest';
import { eventually } from '../support/eventually.ts';
import { useFixture } from '../support/hooks.ts';
import { baseVersion, peakInProgressFromEvents, type RolloutStack, startRolloutStack } from './harness.ts';

// 100 simulated nodes in 3 pools with different budgets; soaks of a fraction of a second.
const soakSeconds = 0.4;
const stack = useFixture<RolloutStack>(
  () =>
    startRolloutStack({
      name: 'waves',
      pools: [
        { name: 'alpha', nodes: 40, disruption: { maxUnavailable: '10%', soakSeconds } },
        { name: 'beta', nodes: 35, disruption: { maxUnavailable: 3, soakSeconds } },
        { name: 'gamma', nodes: 25, disruption: { maxUnavailable: '20%', soakSeconds } },
      ],
    }),
  (s) => s.stop(),
);

const budgets = () => new Map(stack.pools.map((p, i) => [p.id, [4, 3, 5][i]!]));

async function create(releaseId: string, key: string, selector?: { poolIds: string[] }) {
  const answer = await stack.call('rollouts/create', {
    releaseId,
    selector: selector ?? { poolIds: stack.pools.map((p) => p.id) },
    idempotencyKey: key,
  });
  expect(answer.status, JSON.stringify(answer.body)).toBe(200);
  return answer.body.data;
}

describe('rollouts of signed bcd releases in waves', { timeout: 300_000 }, () => {
  it('moves 100 nodes in 3 pools to the release without ever exceeding any pool’s budget', async () => {
    const releaseId = await stack.publish('0.2.0');
    const created = await create(releaseId, 'waves-1');
    expect(created).toMatchObject({ state: 'running', version: '0.2.0', created: true });
    expect(created.waves.map((w: { nodes: number }) => w.nodes)).toEqual([1, 9, 40, 50]);
    // The same key again is the same rollout.
    const again = await create(releaseId, 'waves-1');
    expect(again).toMatchObject({ id: created.id, created: false });

    const done = await stack.waitFor(created.id, (r) => r.state === 'completed');
    expect(
      done.waves.every((w: { done: number; nodes: number }) => w.done === w.nodes),
      JSON.stringify(done.waves),
    ).toBe(true);
    const nodes = await stack.call('nodes/list', { limit: 100 });
    expect(nodes.body.data.nodes).toHaveLength(100);
    expect(new Set(nodes.body.data.nodes.map((n: { agentVersion: string }) => n.agentVersion))).toEqual(
      new Set(['0.2.0']),
    );

    const { peak, starts } = await peakInProgressFromEvents(stack, created.id);
    expect(starts).toBe(100);
    for (const [poolId, max] of budgets()) {
      expect(peak.get(poolId)).toBeGreaterThan(0);
      expect(peak.get(poolId)).toBeLessThanOrEqual(max);
    }
    // Each update came back under a newer session epoch, and its command ran once.
    const commands = await stack.api.database.db
      .selectFrom('node_commands')
      .select(({ fn }) => ['node_id', fn.countAll<string>().as('n')])
      .where('kind', '=', 'bcd.update')
      .groupBy('node_id')
      .execute();
    expect(commands.every((c) => Number(c.n) === 1)).toBe(true);
    // The workflow carries the release, the wave and the state for the Temporal UI.
    const described = await stack.temporal.client.workflow.getHandle(created.id).describe();
    expect(described.searchAttributes).toMatchObject({
      ComputeState: ['completed'],
      ComputeRelease: [releaseId],
      ComputeWave: ['4/4'],
    });
  });

  it('a version that crashes at start pauses the rollout in its first wave, the node back on its version', async () => {
    const releaseId = await stack.publish('0.3.0', 'crash-at-start');
    const gamma = stack.pools[2]!;
    const rollout = await create(releaseId, 'crash-1', { poolIds: [gamma.id] });
    const paused = await stack.waitFor(rollout.id, (r) => r.state === 'paused');
    expect(paused.currentWave).toBe(0);
    expect(paused.pauseReason).toMatch(/1 of 1 node\(s\) of wave 1 failed/);
    const failure = paused.waves[0].failures[0];
    expect(failure.reason).toMatch(/bcd rolled back by itself: 0\.3\.0 crashed at start; back on 0\.2\.0/);
    await eventually(async () => {
      const node = await stack.call('nodes/get', { nodeId: failure.nodeId });
      if (!node.body.data) throw new Error(JSON.stringify(node.body));
      return node.body.data.agentVersion === '0.2.0' && node.body.data.connectivity === 'connected';
    });
    expect(
      paused.waves.slice(1).every((w: { pending: number; nodes: number }) => w.pending === w.nodes),
    ).toBe(true);
    const events = await stack.api.database.db
      .selectFrom('outbox_events')
      .select(['data'])
      .where('type', '=', 'rollout.paused')
      .where('subject', '=', `rollout/${rollout.id}`)
      .execute();
    expect(events).toHaveLength(1);
    expect((events[0]!.data as { failures: unknown[] }).failures).toHaveLength(1);
    // Which rollouts are paused, from Temporal's visibility.
    const described = await stack.temporal.client.workflow.getHandle(rollout.id).describe();
    expect(described.searchAttributes.ComputeState).toEqual(['paused']);

    const aborted = await stack.call('rollouts/abort', { rolloutId: rollout.id });
    expect(aborted.body.data.state).toBe('aborted');
    await stack.temporal.client.workflow.getHandle(rollout.id).result();
  });

  it('resume after a pause finishes the waves; a completed rollout is not aborted', async () => {
    stack.faults.set('0.4.0', 'unhealthy');
    const releaseId = await stack.publish('0.4.0');
    const beta = stack.pools[1]!;
    const rollout = await create(releaseId, 'resume-1', { poolIds: [beta.id] });
    const paused = await stack.waitFor(rollout.id, (r) => r.state === 'paused');
    expect(paused.waves[0].failures[0].reason).toMatch(/unhealthy/);
    stack.faults.delete('0.4.0');
    const resumed = await stack.call('rollouts/resume', { rolloutId: rollout.id });
    expect(resumed.body.data.state).toBe('running');
    const done = await stack.waitFor(rollout.id, (r) => r.state === 'completed');
    expect(done.waves.slice(1).every((w: { done: number; nodes: number }) => w.done === w.nodes)).toBe(true);
    expect(done.waves[0].failures[0]).toMatchObject({ acknowledged: true, rolledBack: true });

    // A completed rollout is not aborted; a running one rolls back.
    const late = await stack.call('rollouts/abort', { rolloutId: rollout.id, rollback: true });
    expect(late.status).toBe(409);
    expect(late.body.error.code).toBe('INVALID_STATE');
  });

  it('a worker killed mid-wave loses nothing: a new worker finishes every node once', async () => {
    const releaseId = await stack.publish('0.5.0');
    const rollout = await create(releaseId, 'kill-1');
    await stack.waitFor(
      rollout.id,
      (r) => r.currentWave >= 2 && r.waves[2].done > 0 && r.waves[2].done < 20,
      120_000,
    );
    await stack.temporal.worker!.stop();
    stack.temporal.worker = null;
    await new Promise((r) => setTimeout(r, 1_500)); // wall time: the gates move on without a worker
    await stack.temporal.startWorker();
    const done = await stack.waitFor(rollout.id, (r) => r.state === 'completed');
    expect(done.waves.reduce((n: number, w: { done: number }) => n + w.done, 0)).toBe(100);
    const { peak, starts } = await peakInProgressFromEvents(stack, rollout.id);
    expect(starts).toBe(100);
    for (const [poolId, max] of budgets()) expect(peak.get(poolId)).toBeLessThanOrEqual(max);
    const twice = await stack.api.database.db
      .selectFrom('node_commands')
      .select(({ fn }) => ['node_id', fn.countAll<string>().as('n')])
      .where('kind', '=', 'bcd.update')
      .where('payload', '@>', JSON.stringify({ releaseId }) as never)
      .groupBy('node_id')
      .having(({ fn }) => fn.countAll(), '>', 1)
      .execute();
    expect(twice).toEqual([]);
    expect(baseVersion).toBe('0.1.0');
  });

  it('abort --rollback rolls updated nodes back to their previous version, latest wave first', async () => {
    const releaseId = await stack.publish('0.6.0');
    const gamma = stack.pools[2]!;
    const rollout = await create(releaseId, 'rollback-1', { poolIds: [gamma.id] });
    await stack.waitFor(rollout.id, (r) => r.currentWave >= 2 && r.waves[2].done >= 2, 120_000);
    const aborting = await stack.call('rollouts/abort', { rolloutId: rollout.id, rollback: true });
    expect(aborting.body.data).toMatchObject({ state: 'aborted', abortMode: 'rollback' });
    const back = await stack.waitFor(rollout.id, (r) => r.rollback === 'rolled-back');
    const versions = await stack.api.database.db
      .selectFrom('nodes')
      .select('agent_version')
      .where('pool_id', '=', gamma.id)
      .execute();
    expect(new Set(versions.map((v) => v.agent_version))).toEqual(new Set(['0.5.0']));
    const rolledBack = back.nodes.filter((n: { state: string }) => n.state === 'rolled-back');
    expect(rolledBack.length).toBeGreaterThanOrEqual(1 + 4 + 2);
    // Reverse waves: the first rollback started is of the latest wave reached.
    const order = await stack.api.database.db
      .selectFrom('outbox_events')
      .select(['data'])
      .where('type', '=', 'rollout.node-rolling-back')
      .where('subject', '=', `rollout/${rollout.id}`)
      .orderBy(sql`xid`)
      .orderBy('seq')
      .execute();
    const waves = order.map((e) => (e.data as { wave: number }).wave);
    expect(waves).toEqual([...waves].sort((a, b) => b - a));
  });
});
