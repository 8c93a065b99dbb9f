import { describe, expect, it, vi } from 'vitest';
import { useFixture } from '../support/hooks.ts';
import { peakInProgressFromEvents, type RolloutStack, startRolloutStack } from './harness.ts';

// The budget rule at scale: 100 simulated nodes in 3 pools with different budgets, soaks of a
// fraction of a second. The rollout's other rules run on a small fleet (rollout-control.test.ts).
// A hundred nodes joining take a while on a loaded machine (a minute or two; far more when a
// shared machine runs several suites at once).
vi.setConfig({ hookTimeout: 600_000 });
const soakSeconds = 0.4;
const stack = useFixture<RolloutStack>(
  () =>
    startRolloutStack({
      name: 'waves',
      pools: [
        { name: 'alpha', nodes: 40, disruption: { maxUnavailable: '10%', soakSeconds } },
        { name: 'beta', nodes: 35, disruption: { maxUnavailable: 5, soakSeconds } },
        { name: 'gamma', nodes: 25, disruption: { maxUnavailable: '20%', soakSeconds } },
      ],
    }),
  (s) => s.stop(),
);

const budgets = () => new Map(stack.pools.map((p, i) => [p.id, [4, 5, 5][i]!]));

async function create(releaseId: string, key: string) {
  const answer = await stack.call('rollouts/create', {
    releaseId,
    selector: { poolIds: stack.pools.map((p) => p.id) },
    idempotencyKey: key,
  });
  expect(answer.status, JSON.stringify(answer.body)).toBe(200);
  return answer.body.data;
}

describe('rollouts of signed bcd releases in waves', { timeout: 600_000 }, () => {
  it('moves 100 nodes in 3 pools to the release without ever exceeding any pool’s budget', async () => {
    const releaseId = await stack.publish('0.2.0');
    const created = await create(releaseId, 'waves-1');
    expect(created).toMatchObject({ state: 'running', version: '0.2.0', created: true });
    expect(created.waves.map((w: { nodes: number }) => w.nodes)).toEqual([1, 9, 40, 50]);
    // The same key again is the same rollout.
    const again = await create(releaseId, 'waves-1');
    expect(again).toMatchObject({ id: created.id, created: false });

    const done = await stack.waitFor(created.id, (r) => r.state === 'completed', 480_000);
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
    // The workflow carries the release, the wave and the state for the Temporal UI. The row turns
    // completed inside the last activity; the workflow's closing task lands just after it.
    const handle = stack.temporal.client.workflow.getHandle(created.id);
    await handle.result();
    const described = await handle.describe();
    expect(described.searchAttributes).toMatchObject({
      ComputeState: ['completed'],
      ComputeRelease: [releaseId],
      ComputeWave: ['4/4'],
    });
  });
});
