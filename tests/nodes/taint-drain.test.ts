import { describe, expect, it } from 'vitest';
import { createSweeperActivities } from '../../activities/sweeper.ts';
import { bootstrapPlatform } from '../../iam/bootstrap.ts';
import { useLifecycleApi } from '../lifecycle/harness.ts';
import { callApi } from '../support/api.ts';

/**
 * Operator taints and drains that finish, on the real PostgreSQL and Temporal: a taint is a named
 * NoSchedule reason the placer reads like the controllers' own conditions (the NoFit summary names
 * it); a draining node becomes drained, with `node.drained`, when its last allocation ends; the
 * sweeper finishes a drain any ending path missed; uncordon clears it.
 */
const h = useLifecycleApi({
  name: 'taint-drain',
  nodes: 2,
  timers: { bindTimeoutMs: 600_000, pendingRetryMs: 1_000 },
  pool: { ownerTenantId: 'platform', gpuQuota: 64 },
});

// biome-ignore lint/suspicious/noExplicitAny: the answers are read field by field below
type Answer = { status: number; body: { data: any; error?: { code: string; message: string } } };

let rootToken: string | undefined;
async function root(): Promise<string> {
  rootToken ??= (await bootstrapPlatform(h.iam)).rootAdminToken;
  return rootToken;
}

async function call(path: string, body: unknown, token?: string): Promise<Answer> {
  const { status, body: answer } = await callApi(h.compute.app, token ?? (await root()), path, body);
  return { status, body: answer as Answer['body'] };
}

async function ok(path: string, body: unknown, token?: string) {
  const answer = await call(path, body, token);
  expect(answer.status, `${path}: ${JSON.stringify(answer.body)}`).toBe(200);
  return answer.body.data;
}

async function reserve(key: string) {
  return ok(
    'reservations/create',
    {
      tenantId: 'acme',
      poolId: h.poolId,
      devices: [{ class: 'gpu', count: 2 }],
      duration: '1h',
      idempotencyKey: key,
    },
    h.credential.token,
  ) as Promise<{
    id: string;
    state: string;
    conditions: Array<{ message: string }>;
    allocations: Array<{ nodeId: string }>;
  }>;
}

const reservation = async (id: string) =>
  ok('reservations/get', { tenantId: 'acme', reservationId: id }, h.credential.token);

const release = (id: string) =>
  ok('reservations/release', { tenantId: 'acme', reservationId: id }, h.credential.token);

async function nodeEvents(nodeId: string) {
  const rows = await h.db
    .selectFrom('outbox_events')
    .where('subject', '=', `node/${nodeId}`)
    .select(['type', 'data'])
    .orderBy('seq')
    .execute();
  return rows;
}

const drainEvents = async (nodeId: string) =>
  (await nodeEvents(nodeId)).filter((e) => e.type.startsWith('node.drain'));

describe('nodes.taint / nodes.untaint', () => {
  it('a tainted node takes no new placement, the NoFit summary names the taint; untaint lets it place again', async () => {
    const [a, b] = h.nodes.map((n) => n.id);
    const first = await ok('nodes/taint', { nodeId: a, reason: 'gpu-burn-in' });
    expect(first.changed).toBe(true);
    expect(first.node.taints).toEqual(['gpu-burn-in']);
    expect(first.node.conditions).toEqual([
      expect.objectContaining({ type: 'Taint:gpu-burn-in', reason: 'OperatorTaint', effect: 'NoSchedule' }),
    ]);
    // Idempotent: the same reason twice changes nothing and writes one event.
    expect((await ok('nodes/taint', { nodeId: a, reason: 'gpu-burn-in' })).changed).toBe(false);
    await ok('nodes/taint', { nodeId: b, reason: 'gpu-burn-in' });
    // Two reasons stand at once on one node.
    await ok('nodes/taint', { nodeId: b, reason: 'rack 4 power work' });
    const listed = await ok('nodes/list', { poolId: h.poolId });
    expect(
      Object.fromEntries(listed.nodes.map((n: { id: string; taints: string[] }) => [n.id, n.taints])),
    ).toEqual({
      [a!]: ['gpu-burn-in'],
      [b!]: ['gpu-burn-in', 'rack 4 power work'],
    });
    expect((await nodeEvents(a!)).filter((e) => e.type === 'node.tainted')).toEqual([
      { type: 'node.tainted', data: { nodeId: a, reason: 'gpu-burn-in' } },
    ]);

    const refused = await reserve('taint-refused');
    expect(refused.state).toBe('pending');
    expect(refused.conditions[0]!.message).toContain(
      '0 of 2 nodes fit: 2 have a NoSchedule condition (Taint:gpu-burn-in)',
    );

    // Bad input changes nothing; a tenant that does not own the pool does not see the node.
    const blank = await call('nodes/taint', { nodeId: a, reason: '  ' });
    expect(blank.body.error?.code).toBe('INVALID_INPUT');
    const newline = await call('nodes/taint', { nodeId: a, reason: 'bad\nreason' });
    expect(newline.body.error?.code).toBe('INVALID_INPUT');
    const stranger = await call('nodes/taint', { nodeId: a, reason: 'mine' }, h.credential.token);
    expect(stranger.body.error?.code).toBe('NOT_FOUND');
    expect((await ok('nodes/get', { nodeId: a })).taints).toEqual(['gpu-burn-in']);

    const untainted = await ok('nodes/untaint', { nodeId: a, reason: 'gpu-burn-in' });
    expect(untainted).toMatchObject({ changed: true, node: { taints: [], conditions: [] } });
    expect((await ok('nodes/untaint', { nodeId: a, reason: 'gpu-burn-in' })).changed).toBe(false);
    expect((await nodeEvents(a!)).map((e) => e.type)).toEqual(['node.tainted', 'node.untainted']);
    // The pending reservation tries again and lands on the untainted node.
    await expect
      .poll(async () => (await reservation(refused.id)).state, { timeout: 30_000, interval: 500 })
      .not.toBe('pending');
    expect((await reservation(refused.id)).allocations.map((x: { nodeId: string }) => x.nodeId)).toEqual([a]);
    await release(refused.id);
    await ok('nodes/untaint', { nodeId: b, reason: 'gpu-burn-in' });
    await ok('nodes/untaint', { nodeId: b, reason: 'rack 4 power work' });
    // The audit trail names the action.
    const audits = await h.db
      .selectFrom('audit_events')
      .where('resource_id', '=', b!)
      .where('action', '=', 'compute:nodes:taint')
      .select('action')
      .execute();
    expect(audits).toHaveLength(4);
  }, 120_000);
});

describe('drains that finish', () => {
  it('a draining node becomes drained (node.drained) when its last allocation ends; an empty one at once; uncordon clears it', async () => {
    const placed = await reserve('drain-holder');
    expect(placed.state).toBe('placed');
    const busy = placed.allocations[0]!.nodeId;
    const idle = h.nodes.map((n) => n.id).find((id) => id !== busy)!;

    const draining = await ok('nodes/drain', { nodeId: busy, reason: 'firmware' });
    expect(draining).toMatchObject({
      liveAllocations: 1,
      node: { draining: true, drained: false, drainedAt: null },
    });
    // An empty node is drained by the drain itself.
    const empty = await ok('nodes/drain', { nodeId: idle, reason: 'firmware' });
    expect(empty.node).toMatchObject({ draining: true, drained: true });
    expect((await drainEvents(idle)).map((e) => e.type)).toEqual(['node.draining', 'node.drained']);
    expect((await drainEvents(busy)).map((e) => e.type)).toEqual(['node.draining']);

    await release(placed.id);
    await expect
      .poll(async () => (await ok('nodes/get', { nodeId: busy })).drained, { timeout: 30_000, interval: 300 })
      .toBe(true);
    const node = await ok('nodes/get', { nodeId: busy });
    expect(node).toMatchObject({ draining: true, cordoned: true, drained: true });
    expect(node.drainedAt).toEqual(expect.any(Number));
    const events = await drainEvents(busy);
    expect(events.map((e) => e.type)).toEqual(['node.draining', 'node.drained']);
    expect(events[1]!.data).toMatchObject({ nodeId: busy, poolId: h.poolId, reason: 'firmware' });
    // The drain is committed with the release that finished it: no allocation of the node is live.
    const live = await h.db
      .selectFrom('allocations')
      .where('node_id', '=', busy)
      .where('state', 'not in', ['released', 'failed'])
      .select('id')
      .execute();
    expect(live).toEqual([]);

    // Draining again changes nothing; the drain stays finished.
    const again = await ok('nodes/drain', { nodeId: busy });
    expect(again.node).toMatchObject({ drained: true, drainedAt: node.drainedAt });
    expect((await drainEvents(busy)).map((e) => e.type)).toEqual(['node.draining', 'node.drained']);

    const uncordoned = await ok('nodes/uncordon', { nodeId: busy });
    expect(uncordoned.node).toMatchObject({
      cordoned: false,
      draining: false,
      drained: false,
      drainedAt: null,
    });
    expect(uncordoned.node.conditions.filter((c: { type: string }) => c.type === 'Draining')).toEqual([]);
    await ok('nodes/uncordon', { nodeId: idle });
    const next = await reserve('after-uncordon');
    expect(next.state).toBe('placed');
    await release(next.id);
  }, 120_000);

  it('the sweeper finishes a drain whose last allocation ended on a path that did not', async () => {
    const placed = await reserve('sweep-holder');
    const nodeId = placed.allocations[0]!.nodeId;
    const drainedBefore = (await nodeEvents(nodeId)).filter((e) => e.type === 'node.drained').length;
    await ok('nodes/drain', { nodeId, reason: 'sweep' });
    // An allocation ended behind the ending paths' back (as a node's own report does).
    await h.db
      .updateTable('allocations')
      .set({ state: 'released' })
      .where('reservation_id', '=', placed.id)
      .execute();
    expect((await ok('nodes/get', { nodeId })).drained).toBe(false);
    const sweeper = createSweeperActivities({ db: h.db, log: h.log, lifecycle: h.lifecycle });
    expect(await sweeper.sweepUnfinishedDrains({ limit: 100 })).toEqual({ drained: [nodeId] });
    expect(await sweeper.sweepUnfinishedDrains({ limit: 100 })).toEqual({ drained: [] });
    expect((await ok('nodes/get', { nodeId })).drained).toBe(true);
    expect((await nodeEvents(nodeId)).filter((e) => e.type === 'node.drained')).toHaveLength(
      drainedBefore + 1,
    );
    await ok('nodes/uncordon', { nodeId });
  }, 120_000);
});
