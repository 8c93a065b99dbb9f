import { sql } from 'kysely';
import { describe, expect, it } from 'vitest';
import { advanceComputeClock, readComputeNow } from '../../db/clock.ts';
import { bookingRepairWorkflowId } from '../../domain/booking-repair.ts';
import { bootstrapPlatform } from '../../iam/bootstrap.ts';
import { searchAttributes } from '../../workflows/search-attributes.ts';
import { useLifecycleApi } from '../lifecycle/harness.ts';
import { callApi } from '../support/api.ts';

/**
 * Calendar reservations on the real PostgreSQL and Temporal: BookingRepair runs as its own
 * workflow 15 minutes before the start (the compute clock is moved there; the lifecycle looks
 * again every second) and again at the start.
 */
const h = useLifecycleApi({
  name: 'calendar-repair',
  nodes: 3,
  // The real 15 minutes before the start; a long bind deadline so started reservations keep their nodes.
  timers: { preStartMs: 15 * 60_000, recheckMs: 1_000, bindTimeoutMs: 600_000, pendingRetryMs: 1_000 },
  pool: { ownerTenantId: 'platform', gpuQuota: 64 },
});

const hour = 3_600_000;

async function call(path: string, body: unknown, token = h.credential.token) {
  const { status, body: answer } = await callApi(h.compute.app, token, path, body);
  // biome-ignore lint/suspicious/noExplicitAny: the answers are read field by field below
  return { status, body: answer as { data: any; error?: { code: string; message: string } } };
}

async function reserveAt(start: number, key: string) {
  const created = await call('reservations/create', {
    tenantId: 'acme',
    poolId: h.poolId,
    devices: [{ class: 'gpu', count: 2 }],
    duration: '1h',
    start,
    idempotencyKey: key,
  });
  expect(created.status, JSON.stringify(created.body)).toBe(200);
  return created.body.data as { id: string; state: string; allocations: Array<{ nodeId: string }> };
}

const get = async (id: string) =>
  (await call('reservations/get', { tenantId: 'acme', reservationId: id })).body.data;

async function eventsOf(id: string, type: string) {
  return h.db
    .selectFrom('outbox_events')
    .where('subject', '=', `reservation/${id}`)
    .where('type', '=', type)
    .select('data')
    .orderBy('seq')
    .execute();
}

async function cordon(nodeId: string, cordoned: boolean) {
  await h.db.updateTable('nodes').set({ cordoned }).where('id', '=', nodeId).execute();
}

describe('BookingRepair', () => {
  it('moves a calendar booking off a node cordoned after admission, 15 minutes before the start', async () => {
    const now = (await readComputeNow(h.db)).getTime();
    const start = now + 2 * hour;
    const r = await reserveAt(start, 'repair-moves');
    expect(r.state).toBe('placed');
    const from = r.allocations[0]!.nodeId;

    // The operator cordons it through the API: the answer counts the node's calendar bookings.
    const { rootAdminToken } = await bootstrapPlatform(h.iam);
    const cordoned = await call('nodes/cordon', { nodeId: from, reason: 'disk swap' }, rootAdminToken);
    expect(cordoned.status).toBe(200);
    expect(cordoned.body.data.calendarBookings).toBe(1);
    expect(cordoned.body.data.message).toMatch(/1 calendar booking on this node/);
    const node = await call('nodes/get', { nodeId: from }, rootAdminToken);
    expect(node.body.data.calendarBookings).toEqual([
      expect.objectContaining({ reservationId: r.id, tenantId: 'acme', start, atoms: 2 }),
    ]);
    const capacity = await call('capacity/nodes', { tenantId: 'acme', poolId: h.poolId });
    const row = capacity.body.data.nodes.find((n: { nodeId: string }) => n.nodeId === from);
    expect(row.calendarBookings).toEqual({ count: 1, nextStart: start, atRisk: true });

    // Nothing happens before the moment.
    await new Promise((resolve) => setTimeout(resolve, 1_500));
    expect(await eventsOf(r.id, 'reservation.repaired')).toHaveLength(0);

    // 14 minutes before the start.
    await advanceComputeClock(h.db, 2 * hour - 14 * 60_000);
    await expect
      .poll(async () => (await eventsOf(r.id, 'reservation.repaired')).length, { timeout: 30_000 })
      .toBe(1);
    const [event] = await eventsOf(r.id, 'reservation.repaired');
    const moves = (event!.data as { moves: Array<Record<string, unknown>>; moment: string }).moves;
    expect((event!.data as { moment: string }).moment).toBe('pre-start');
    expect(moves).toHaveLength(1);
    expect(moves[0]).toMatchObject({ fromNodeId: from, reason: 'cordoned' });
    expect(moves[0]!.toNodeId).not.toBe(from);

    const view = await get(r.id);
    expect(view.state).toBe('placed');
    expect(view.allocations.map((a: { nodeId: string }) => a.nodeId)).toEqual([moves[0]!.toNodeId]);
    expect(view.repairs).toEqual([
      expect.objectContaining({
        moment: 'pre-start',
        outcome: 'repaired',
        moves: [expect.objectContaining({ fromNodeId: from })],
      }),
    ]);
    expect(view.during.start).toBe(start);
    // The old booking is gone; the new one holds the same window.
    const bookings = await sql<{ node_id: string; start: Date; end: Date }>`
      SELECT a.node_id, lower(b.during) AS start, upper(b.during) AS "end" FROM device_bookings b
      JOIN allocations a ON a.id = b.allocation_id WHERE a.reservation_id = ${r.id}`.execute(h.db);
    expect(bookings.rows.map((b) => b.node_id)).toEqual([moves[0]!.toNodeId, moves[0]!.toNodeId]);
    expect(bookings.rows.every((b) => b.start.getTime() === start && b.end.getTime() === start + hour)).toBe(
      true,
    );

    // Its own workflow, filterable in the Temporal UI.
    // The repair commits inside its activity; the workflow's search attributes land as it closes.
    const repair = h.temporal.client.workflow.getHandle(bookingRepairWorkflowId(r.id, 'pre-start'));
    await repair.result();
    const described = await repair.describe();
    expect(described.type).toBe('bookingRepair');
    expect(described.typedSearchAttributes.get(searchAttributes.reservation)).toBe(r.id);
    expect(described.typedSearchAttributes.get(searchAttributes.state)).toBe('repaired');

    // At the start the repair runs again (finds it healthy) and the reservation binds.
    await advanceComputeClock(h.db, 15 * 60_000);
    await expect.poll(async () => (await get(r.id)).state, { timeout: 30_000 }).toBe('binding');
    const startRepair = h.temporal.client.workflow.getHandle(bookingRepairWorkflowId(r.id, 'start'));
    await startRepair.result();
    const atStart = await startRepair.describe();
    expect(atStart.typedSearchAttributes.get(searchAttributes.state)).toBe('healthy');
    await call('reservations/release', { tenantId: 'acme', reservationId: r.id });
    await cordon(from, false);
  });

  it('keeps the bookings and says why when nothing fits, and goes back to pending at the start', async () => {
    const now = (await readComputeNow(h.db)).getTime();
    const start = now + 2 * hour;
    // Three calendar reservations fill the three nodes for the same hour.
    const rs = [];
    for (const key of ['full-a', 'full-b', 'full-c']) rs.push(await reserveAt(start, key));
    const victim = rs[0]!;
    const bad = victim.allocations[0]!.nodeId;
    await cordon(bad, true);

    await advanceComputeClock(h.db, 2 * hour - 14 * 60_000);
    await expect
      .poll(async () => (await get(victim.id)).conditions, { timeout: 30_000 })
      .toEqual([expect.objectContaining({ type: 'Unschedulable', reason: 'BookingRepairFailed' })]);
    const placed = await get(victim.id);
    expect(placed.state).toBe('placed');
    expect(placed.conditions[0].message).toMatch(
      /no place for the booking on .* \(cordoned\): 0 of 3 nodes fit/,
    );
    // Nothing moved: the booking is still there (all or nothing).
    expect(placed.allocations.map((a: { nodeId: string }) => a.nodeId)).toEqual([bad]);
    expect(placed.allocations[0].deviceIds).toHaveLength(2);
    expect(placed.repairs).toEqual([expect.objectContaining({ moment: 'pre-start', outcome: 'failed' })]);
    expect(await eventsOf(victim.id, 'reservation.repaired')).toHaveLength(0);
    // A failed repair is published on its own, with the placer's summary.
    const failedEvents = await eventsOf(victim.id, 'reservation.repair-failed');
    expect(failedEvents).toHaveLength(1);
    expect(failedEvents[0]!.data).toMatchObject({
      moment: 'pre-start',
      state: 'placed',
      summary: expect.stringMatching(/0 of 3 nodes fit/),
      bad: [expect.objectContaining({ nodeId: bad, reason: 'cordoned' })],
    });
    // The others were healthy and untouched.
    for (const other of rs.slice(1)) expect((await get(other.id)).repairs).toEqual([]);

    // At the start it is still broken: pending, its bookings released, retried like any other.
    await advanceComputeClock(h.db, 15 * 60_000);
    await expect.poll(async () => (await get(victim.id)).state, { timeout: 30_000 }).toBe('pending');
    const pending = await get(victim.id);
    expect(pending.allocations).toEqual([]);
    expect(
      pending.repairs.map((x: { moment: string; outcome: string }) => `${x.moment}:${x.outcome}`),
    ).toEqual(['pre-start:failed', 'start:failed']);
    const pendingEvents = await eventsOf(victim.id, 'reservation.pending');
    expect(pendingEvents.at(-1)!.data).toMatchObject({ reason: 'BookingRepairFailed' });

    // The node comes back: the pending retry places it there.
    await cordon(bad, false);
    await expect.poll(async () => (await get(victim.id)).state, { timeout: 30_000 }).not.toBe('pending');
    for (const r of rs) await call('reservations/release', { tenantId: 'acme', reservationId: r.id });
  });
});
