import { afterEach, describe, expect, it, vi } from 'vitest';
import { parseConfig } from '../../core/config.ts';
import { checkBookingInvariants } from '../../db/allocations/invariants.ts';
import { advanceComputeClock, readComputeNow } from '../../db/clock.ts';
import { createCompute } from '../../server/compute.ts';
import { preemptionWakeSignal } from '../../workflows/preemption/messages.ts';
import { eventTypes, reportAllocation, useLifecycleApi, waitForState } from '../lifecycle/harness.ts';

// A machine shared by several engineers' suites: a step may take tens of seconds.
vi.setConfig({ testTimeout: 300_000 });
/**
 * What happens to a preemption after it was decided, on one node of two GPUs with real
 * PostgreSQL and Temporal: capacity.preview says a regular request would fit by preempting; the
 * spot reservation under notice cannot be extended; cancelling the regular reservation during the
 * notice calls the preemption off; and a preemption whose workflow was never started (the API died
 * after the commit) is started by the orphan sweeper.
 */
const h = useLifecycleApi({
  name: 'spot-call-off',
  nodes: 1,
  timers: { bindTimeoutMs: 60_000, maxPendingMs: 600_000 },
  sweeper: { everyMs: 1_000, graceMs: 500 },
});

const tenantId = 'acme';
const get = (id: string) => h.compute.api.reservations.get(h.credential, { tenantId, reservationId: id });
const request = (key: string, gpus: number, extra: Record<string, unknown> = {}) => ({
  tenantId,
  poolId: h.poolId,
  devices: [{ class: 'gpu' as const, count: gpus }],
  duration: '2h',
  idempotencyKey: key,
  ...extra,
});

/** Creates a reservation and brings it to `active` (the node's report is simulated). */
async function createActive(key: string, gpus: number, extra: Record<string, unknown> = {}) {
  const created = await h.compute.api.reservations.create(h.credential, request(key, gpus, extra));
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
  return get(created.id);
}

const live: string[] = [];
afterEach(async () => {
  for (const id of live.splice(0)) {
    await h.compute.api.reservations.release(h.credential, { tenantId, reservationId: id }).catch(() => {});
    await waitForState(h, id, ['released', 'cancelled', 'failed'], 60_000);
  }
});

describe('a preemption after its decision', () => {
  it('is previewed, refuses to extend the spot one, and is called off when the regular one is cancelled', async () => {
    const spot = await createActive('co-spot', 2, { spot: true });
    live.push(spot.id);
    const originalEnd = spot.during!.end;
    const now = (await readComputeNow(h.db)).getTime();

    // capacity.preview: no free capacity, but it would fit by preempting, from the notice deadline.
    const { idempotencyKey: _, ...previewInput } = request('co-preview', 2);
    const preview = await h.compute.api.capacity.preview(h.credential, previewInput);
    expect(preview.fits).toBe(false);
    expect(preview.preemption).toMatchObject({
      spotReservations: [spot.id],
      noticed: [spot.id],
      noticeSeconds: 120,
    });
    expect(preview.preemption!.window.start - now).toBeGreaterThanOrEqual(120_000);
    expect(preview.preemption!.message).toMatch(
      /fits by preempting 1 spot reservation\(s\).*120 s of notice/,
    );
    // The preview cut nothing.
    expect((await get(spot.id)).during!.end).toBe(originalEnd);

    const regular = await h.compute.api.reservations.create(h.credential, request('co-regular', 2));
    live.push(regular.id);
    expect(regular.state).toBe('placed');
    const deadline = regular.during!.start;
    expect((await get(spot.id)).during!.end).toBe(deadline);

    // The spot one cannot move its end past the deadline it was given.
    await expect(
      h.compute.api.reservations.extend(h.credential, {
        tenantId,
        reservationId: spot.id,
        by: '1h',
        idempotencyKey: 'co-extend',
      }),
    ).rejects.toMatchObject({ code: 'INVALID_STATE', message: expect.stringMatching(/preemption notice/) });

    const workflow = h.temporal.client.workflow.getHandle(`preemption-${regular.id}-${deadline}`);
    await expect
      .poll(async () => (await workflow.describe()).status.name, { timeout: 60_000 })
      .toBe('RUNNING');

    // Cancelled during the notice: the spot reservation gets its capacity and its end back.
    const cancelled = await h.compute.api.reservations.cancel(h.credential, {
      tenantId,
      reservationId: regular.id,
    });
    expect(cancelled.state).toBe('cancelled');
    const restored = await get(spot.id);
    expect(restored.state).toBe('active');
    expect(restored.during!.end).toBe(originalEnd);
    expect(restored.conditions.map((c) => c.type)).not.toContain('Preempted');
    const row = await h.db
      .selectFrom('reservations')
      .where('id', '=', spot.id)
      .select('preempt_notice_until')
      .executeTakeFirstOrThrow();
    expect(row.preempt_notice_until).toBeNull();
    expect(await eventTypes(h, spot.id)).toContain('reservation.preemption-called-off');
    const bookingEnds = await h.db
      .selectFrom('device_bookings as b')
      .innerJoin('allocations as a', 'a.id', 'b.allocation_id')
      .where('a.reservation_id', '=', spot.id)
      .select('b.during')
      .execute();
    expect(bookingEnds.length).toBe(2);
    expect(await checkBookingInvariants(h.db)).toEqual({ deviceOverlaps: 0, scalarOverbookings: 0 });

    // The preemption's workflow finishes without releasing anything.
    expect(await workflow.result()).toEqual({ released: [] });

    // Past the old deadline (and the lifecycle's back-stop) it still runs, and now extends.
    await advanceComputeClock(h.db, deadline - now + 61_000);
    await h.lifecycle.signal(spot.id, { type: 'wake', reason: 'test' });
    const extended = await h.compute.api.reservations.extend(h.credential, {
      tenantId,
      reservationId: spot.id,
      by: '1h',
      idempotencyKey: 'co-extend-later',
    });
    expect(extended.extended).toBe(true);
    expect(extended.reservation.during!.end).toBe(originalEnd + 3_600_000);
    expect((await get(spot.id)).state).toBe('active');
  });

  it('is started by the orphan sweeper when the API died between the commit and the workflow start', async () => {
    const spot = await createActive('orphan-spot', 2, { spot: true });
    live.push(spot.id);
    // An API whose process "dies" right after the placement commits: it never starts the workflow.
    const crashing = createCompute({
      config: parseConfig({}),
      db: h.db,
      log: h.log,
      iam: h.iam,
      lifecycle: { ...h.lifecycle, preempt: undefined },
      temporal: h.temporal.client,
    });
    const now = (await readComputeNow(h.db)).getTime();
    const regular = await crashing.api.reservations.create(h.credential, request('orphan-regular', 2));
    live.push(regular.id);
    expect(regular.state).toBe('placed');
    const deadline = regular.during!.start;

    // The sweeper (a Schedule, every second here) starts the missing preemption workflow.
    const workflow = h.temporal.client.workflow.getHandle(`preemption-${regular.id}-${deadline}`);
    await expect
      .poll(async () => (await workflow.describe().catch(() => null))?.status.name, {
        timeout: 60_000,
        interval: 500,
      })
      .toBe('RUNNING');
    expect((await workflow.describe()).type).toBe('spotPreemption');

    // It owns the notice: at the deadline it releases the spot reservation with reason preempted.
    await advanceComputeClock(h.db, deadline - now + 1_000);
    await workflow.signal(preemptionWakeSignal, { reason: 'test' });
    expect(await workflow.result()).toEqual({ released: [spot.id] });
    const released = await get(spot.id);
    expect(released).toMatchObject({ state: 'released', endReason: 'preempted' });
  });
});
