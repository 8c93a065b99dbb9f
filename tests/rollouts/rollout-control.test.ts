import { sql } from 'kysely';
import { describe, expect, it } from 'vitest';
import { eventually } from '../support/eventually.ts';
import { useFixture } from '../support/hooks.ts';
import { baseVersion, peakInProgressFromEvents, type RolloutStack, startRolloutStack } from './harness.ts';

// The rules a rollout keeps besides its budgets at scale (rollout.test.ts), on a small fleet: two
// pools of 8 and 6 simulated nodes, two of each updating at once, soaks of a fraction of a second,
// and the orphan sweeper's Schedule every 2 s.
const soakSeconds = 0.3;
const stack = useFixture<RolloutStack>(
  () =>
    startRolloutStack({
      name: 'control',
      pools: [
        { name: 'alpha', nodes: 8, disruption: { maxUnavailable: 2, soakSeconds } },
        { name: 'beta', nodes: 6, disruption: { maxUnavailable: '34%', soakSeconds } },
      ],
      sweeper: { everyMs: 2_000, graceMs: 1_000 },
    }),
  (s) => s.stop(),
);

const budgets = () => new Map(stack.pools.map((p) => [p.id, 2]));

async function create(releaseId: string, key: string, selector?: { poolIds: string[] }, waves?: number[]) {
  const answer = await stack.call('rollouts/create', {
    releaseId,
    selector: selector ?? { poolIds: stack.pools.map((p) => p.id) },
    ...(waves ? { waves } : {}),
    idempotencyKey: key,
  });
  expect(answer.status, JSON.stringify(answer.body)).toBe(200);
  return answer.body.data;
}

describe('a rollout pauses, resumes, aborts, survives its worker and its missing workflow', {
  timeout: 300_000,
}, () => {
  it('a version that crashes at start pauses the rollout in its first wave, the node back on its version', async () => {
    const releaseId = await stack.publish('0.3.0', 'crash-at-start');
    const beta = stack.pools[1]!;
    const rollout = await create(releaseId, 'crash-1', { poolIds: [beta.id] });
    const paused = await stack.waitFor(rollout.id, (r) => r.state === 'paused');
    expect(paused.currentWave).toBe(0);
    expect(paused.pauseReason).toMatch(/1 of 1 node\(s\) of wave 1 failed/);
    const failure = paused.waves[0].failures[0];
    expect(failure.reason).toMatch(/bcd rolled back by itself: 0\.3\.0 crashed at start; back on 0\.1\.0/);
    await eventually(async () => {
      const node = await stack.call('nodes/get', { nodeId: failure.nodeId });
      if (!node.body.data) throw new Error(JSON.stringify(node.body));
      return node.body.data.agentVersion === baseVersion && node.body.data.connectivity === 'connected';
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
    // The row turns paused inside the step's activity; the workflow's upsert lands just after it.
    await expect
      .poll(
        async () =>
          (await stack.temporal.client.workflow.getHandle(rollout.id).describe()).searchAttributes
            .ComputeState,
        {
          timeout: 30_000,
        },
      )
      .toEqual(['paused']);

    // A signal's answer waits a bounded time for the workflow's step: under load, wait for the state.
    expect((await stack.call('rollouts/abort', { rolloutId: rollout.id })).status).toBe(200);
    await stack.waitFor(rollout.id, (r) => r.state === 'aborted');
    await stack.temporal.client.workflow.getHandle(rollout.id).result();
  });

  it('resume after a pause finishes the waves; a completed rollout is not aborted', async () => {
    stack.faults.set('0.4.0', 'unhealthy');
    const releaseId = await stack.publish('0.4.0');
    const alpha = stack.pools[0]!;
    const rollout = await create(releaseId, 'resume-1', { poolIds: [alpha.id] });
    const paused = await stack.waitFor(rollout.id, (r) => r.state === 'paused');
    expect(paused.waves[0].failures[0].reason).toMatch(/unhealthy/);
    stack.faults.delete('0.4.0');
    expect((await stack.call('rollouts/resume', { rolloutId: rollout.id })).status).toBe(200);
    const done = await stack.waitFor(rollout.id, (r) => r.state === 'completed');
    expect(done.waves.slice(1).every((w: { done: number; nodes: number }) => w.done === w.nodes)).toBe(true);
    expect(done.waves[0].failures[0]).toMatchObject({ acknowledged: true, rolledBack: true });

    const late = await stack.call('rollouts/abort', { rolloutId: rollout.id, rollback: true });
    expect(late.status).toBe(409);
    expect(late.body.error.code).toBe('INVALID_STATE');
  });

  it('a worker killed mid-wave loses nothing: a new worker finishes every node once', async () => {
    const releaseId = await stack.publish('0.5.0');
    // Two waves: the second (12 nodes, 4 at a time) is long enough to be caught in the middle.
    const rollout = await create(releaseId, 'kill-1', undefined, [10, 100]);
    await stack.waitFor(
      rollout.id,
      (r) => r.currentWave === 1 && r.waves[1].done > 0 && r.waves[1].pending > 0,
      120_000,
    );
    await stack.temporal.worker!.stop();
    stack.temporal.worker = null;
    await new Promise((r) => setTimeout(r, 1_500)); // wall time: the gates move on without a worker
    await stack.temporal.startWorker();
    const done = await stack.waitFor(rollout.id, (r) => r.state === 'completed');
    expect(done.waves.reduce((n: number, w: { done: number }) => n + w.done, 0)).toBe(14);
    const { peak, starts } = await peakInProgressFromEvents(stack, rollout.id);
    expect(starts).toBe(14);
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
  });

  it('abort --rollback rolls updated nodes back to their previous version, latest wave first', async () => {
    const releaseId = await stack.publish('0.6.0');
    // Waves of 2, 5 and 7 nodes; aborted once the last has started (it takes two rounds of 4).
    const rollout = await create(releaseId, 'rollback-1', undefined, [10, 50, 100]);
    await stack.waitFor(
      rollout.id,
      (r) => r.currentWave === 2 && r.waves[2].inProgress + r.waves[2].done >= 1,
      120_000,
    );
    expect((await stack.call('rollouts/abort', { rolloutId: rollout.id, rollback: true })).status).toBe(200);
    const back = await stack.waitFor(rollout.id, (r) => r.rollback === 'rolled-back');
    expect(back).toMatchObject({ state: 'aborted', abortMode: 'rollback' });
    const versions = await stack.api.database.db.selectFrom('nodes').select('agent_version').execute();
    expect(new Set(versions.map((v) => v.agent_version))).toEqual(new Set(['0.5.0']));
    const rolledBack = back.nodes.filter((n: { state: string }) => n.state === 'rolled-back');
    // Every node of the first two waves, and those of the last that were in their gate at the abort.
    expect(rolledBack.length).toBeGreaterThanOrEqual(2 + 5 + 1);
    expect(back.waves[2].pending).toBeGreaterThanOrEqual(1);
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

  it('the orphan sweeper starts the workflow of a rollout whose create committed and whose start failed', async () => {
    const releaseId = await stack.publish('0.7.0');
    const beta = stack.pools[1]!;
    // The API of the fixture has no Temporal client: the rollout commits, its start cannot happen.
    const answer = await stack.api.call(stack.api.root.token, 'rollouts/create', {
      releaseId,
      selector: { poolIds: [beta.id] },
      waves: [50, 100],
      idempotencyKey: 'orphan-1',
    });
    expect(answer.status, JSON.stringify(answer.body)).toBe(503);
    expect(answer.body.error.code).toBe('UNAVAILABLE');
    const [row] = await stack.api.database.db
      .selectFrom('rollouts')
      .select(['id', 'state'])
      .where('idempotency_key', '=', 'orphan-1')
      .execute();
    expect(row).toMatchObject({ state: 'running' });
    // The sweeper's Schedule finds it without a workflow and starts one, which finishes the rollout.
    const done = await stack.waitFor(row!.id, (r) => r.state === 'completed');
    expect(done.waves.every((w: { done: number; nodes: number }) => w.done === w.nodes)).toBe(true);
    expect(await stack.temporal.client.workflow.getHandle(row!.id).result()).toEqual({ state: 'completed' });
    // The same request again, to an API with Temporal, answers the same rollout.
    const again = await create(releaseId, 'orphan-1', { poolIds: [beta.id] }, [50, 100]);
    expect(again).toMatchObject({ id: row!.id, created: false, state: 'completed' });
  });
});
