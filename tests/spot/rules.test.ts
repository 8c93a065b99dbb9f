import type { ChildProcess } from 'node:child_process';
import { afterAll, describe, expect, it, vi } from 'vitest';
import { advanceComputeClock, readComputeNow } from '../../db/clock.ts';
import { preemptionWakeSignal } from '../../workflows/preemption/messages.ts';
import { killChild, spawnChildWorker } from '../lifecycle/children.ts';
import { reportAllocation, useLifecycleApi, waitForState } from '../lifecycle/harness.ts';

// A machine shared by several engineers' suites: a step may take tens of seconds.
vi.setConfig({ testTimeout: 300_000 });
/**
 * The rules of spot and preemption on one node of two GPUs, with real PostgreSQL and Temporal:
 * a worker SIGKILLed during the notice, spot never preempting, waiting instead of preempting,
 * free capacity first, a spot reservation that had not started re-queued, and spot with a
 * `binding: 'node'` refused.
 */
const activityTimeoutMs = 3_000;
const h = useLifecycleApi({
  name: 'spot-rules',
  nodes: 1,
  worker: false,
  activityTimeoutMs,
  timers: { bindTimeoutMs: 60_000, maxPendingMs: 600_000 },
});
let child: ChildProcess | null = null;

afterAll(async () => {
  if (child) await killChild(child);
});

const tenantId = 'acme';
const get = (id: string) => h.compute.api.reservations.get(h.credential, { tenantId, reservationId: id });
const create = (key: string, gpus: number, extra: Record<string, unknown> = {}) =>
  h.compute.api.reservations.create(h.credential, {
    tenantId,
    poolId: h.poolId,
    devices: [{ class: 'gpu', count: gpus }],
    duration: '2h',
    idempotencyKey: key,
    ...extra,
  });

/** Creates a reservation and brings it to `active` (the node's report is simulated). */
async function createActive(key: string, gpus: number, extra: Record<string, unknown> = {}) {
  const created = await create(key, gpus, extra);
  expect(created.state).toBe('placed');
  await waitForState(h, created.id, 'binding', 60_000);
  const allocation = await h.db
    .selectFrom('allocations')
    .where('reservation_id', '=', created.id)
    .where('superseded_at', 'is', null)
    .select('id')
    .executeTakeFirstOrThrow();
  await reportAllocation(h, created.id, allocation.id, 'bound');
  await waitForState(h, created.id, 'active', 60_000);
  return created;
}

async function end(...ids: string[]) {
  for (const id of ids) {
    await h.compute.api.reservations.release(h.credential, { tenantId, reservationId: id }).catch(() => {});
    await waitForState(h, id, ['released', 'cancelled', 'failed'], 60_000);
  }
}

const noticeOf = async (id: string) =>
  (
    await h.db
      .selectFrom('reservations')
      .where('id', '=', id)
      .select('preempt_notice_until')
      .executeTakeFirstOrThrow()
  ).preempt_notice_until;

describe('spot and preemption', () => {
  it('a worker SIGKILLed during the notice does not lose the preemption', async () => {
    child = await spawnChildWorker(h, { activityTimeoutMs });
    const spot = await createActive('kill-spot', 2, { spot: true });
    const now = (await readComputeNow(h.db)).getTime();
    const regular = await create('kill-regular', 2);
    expect(regular.state).toBe('placed');
    const deadline = regular.during!.start;
    const handle = h.temporal.client.workflow.getHandle(`preemption-${regular.id}-${deadline}`);
    await expect.poll(async () => (await handle.describe()).status.name, { timeout: 60_000 }).toBe('RUNNING');
    // The preemption is filterable in the Temporal UI by the reservation that preempts.
    await expect
      .poll(
        async () => {
          const ids: string[] = [];
          for await (const w of h.temporal.client.workflow.list({
            query: `WorkflowType = 'spotPreemption' AND ComputeReservation = '${regular.id}'`,
          }))
            ids.push(w.workflowId);
          return ids;
        },
        { timeout: 60_000, interval: 500 },
      )
      .toEqual([handle.workflowId]);

    await killChild(child);
    child = null;
    // Past the deadline, but before the spot lifecycle's own back-stop (a minute after it).
    await advanceComputeClock(h.db, deadline - now + 1_000);
    await h.startWorker();
    await handle.signal(preemptionWakeSignal, { reason: 'test' });
    expect(await handle.result()).toEqual({ released: [spot.id] });
    expect(await get(spot.id)).toMatchObject({ state: 'released', endReason: 'preempted' });
    const audit = await h.db
      .selectFrom('audit_events')
      .where('resource_id', '=', spot.id)
      .where('action', '=', 'compute:lifecycle:preempted')
      .select('context')
      .executeTakeFirstOrThrow();
    expect(audit.context).toMatchObject({ actor: 'preemption-workflow', preemptedBy: regular.id });
    await h.lifecycle.signal(regular.id, { type: 'wake', reason: 'test' });
    await waitForState(h, regular.id, 'binding', 60_000);
    await end(regular.id);
  });

  it("refuses spot with binding: 'node' (INVALID_INPUT)", async () => {
    await expect(create('spot-node', 1, { spot: true, binding: 'node' })).rejects.toMatchObject({
      code: 'INVALID_INPUT',
    });
  });

  it('a spot request never preempts', async () => {
    const spot = await createActive('never-spot', 2, { spot: true });
    const other = await create('never-other', 2, { spot: true });
    expect(other.state).toBe('pending');
    expect(await noticeOf(spot.id)).toBeNull();
    expect((await get(spot.id)).state).toBe('active');
    await end(other.id, spot.id);
  });

  it('never preempts over free capacity, nor when waiting less than the notice suffices', async () => {
    const spot = await createActive('wait-spot', 1, { spot: true });
    // A free GPU: the regular request takes it, the spot one is left alone.
    const short = await create('wait-short', 1, { duration: '1m' });
    expect(short.state).toBe('placed');
    expect(await noticeOf(spot.id)).toBeNull();
    // Full now, but the short one ends within the notice (120 s): it waits instead.
    const waiting = await create('wait-regular', 1);
    expect(waiting.state).toBe('pending');
    expect(await noticeOf(spot.id)).toBeNull();
    await end(waiting.id, short.id, spot.id);
  });

  it('re-queues a spot reservation that had not started, and the regular one starts now', async () => {
    const now = (await readComputeNow(h.db)).getTime();
    const later = await create('requeue-spot', 2, { spot: true, start: now + 30 * 60_000 });
    expect(later.state).toBe('placed');
    const regular = await create('requeue-regular', 2, { duration: '3h' });
    expect(regular.state).toBe('placed');
    expect(regular.during!.start).toBeLessThan(now + 60_000);
    const requeued = await get(later.id);
    expect(requeued.state).toBe('pending');
    expect(requeued.conditions).toContainEqual(
      expect.objectContaining({ type: 'Unschedulable', reason: 'SpotPreempted' }),
    );
    await end(later.id, regular.id);
  });
});
