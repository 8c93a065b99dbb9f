import { sql } from 'kysely';
import { describe, expect, it } from 'vitest';
import type { RegisteredNode } from '../../db/nodes/fleet.ts';
import { newId } from '../../domain/ids.ts';
import { wakeSignal } from '../../workflows/reservation/messages.ts';
import {
  eventTypes,
  insertPlacedReservation,
  quotaRefunded,
  reportAllocation,
  reservationConditions,
  useLifecycleHarness,
  waitForState,
} from './harness.ts';

// Short enough that the timeout tests wait seconds; long enough that a test reports a binding
// before it fires, even on a loaded machine.
const h = useLifecycleHarness({ name: 'binding', nodes: 4, timers: { bindTimeoutMs: 6_000 } });

const start = (id: string) => h.startLifecycle(id);

async function nodeAssignments(nodeId: string): Promise<string[]> {
  const node = await h.db
    .selectFrom('nodes')
    .where('id', '=', nodeId)
    .select('spec')
    .executeTakeFirstOrThrow();
  return ((node.spec as { devices?: Array<{ allocationId: string }> }).devices ?? []).map(
    (d) => d.allocationId,
  );
}

/** The data of the reservation's `reservation.pending` event (the reason it went back to pending). */
async function pendingEventData(id: string): Promise<unknown> {
  const event = await h.db
    .selectFrom('outbox_events')
    .where('subject', '=', `reservation/${id}`)
    .where('type', '=', 'reservation.pending')
    .select('data')
    .executeTakeFirstOrThrow();
  return event.data;
}

/** Sets the node's connectivity and its first device's health, then wakes the lifecycle to look. */
async function setNodeHealth(
  reservationId: string,
  node: RegisteredNode,
  connectivity: 'connected' | 'unreachable',
  health: 'healthy' | 'unhealthy',
): Promise<void> {
  await h.db.updateTable('nodes').set({ connectivity }).where('id', '=', node.id).execute();
  await h.db.updateTable('devices').set({ health }).where('id', '=', node.deviceIds[0]!).execute();
  await h.temporal.client.workflow.getHandle(reservationId).signal(wakeSignal, { reason: 'node-health' });
}

async function bindAttempts(id: string): Promise<number> {
  const row = await h.db
    .selectFrom('reservations')
    .where('id', '=', id)
    .select('bind_attempts')
    .executeTakeFirstOrThrow();
  return row.bind_attempts;
}

async function currentAllocation(id: string) {
  return h.db
    .selectFrom('allocations')
    .where('reservation_id', '=', id)
    .where('superseded_at', 'is', null)
    .select(['id', 'node_id', 'state'])
    .executeTakeFirst();
}

describe('binding (hold)', () => {
  it('releases the bookings and places again when no report comes in time, then binds on the new placement', async () => {
    const { id, allocationId } = await insertPlacedReservation(h, { node: h.nodes[0]! });
    await start(id);
    await waitForState(h, id, 'binding');
    expect(await nodeAssignments(h.nodes[0]!.id)).toEqual([allocationId]);
    await expect.poll(() => bindAttempts(id), { timeout: 30_000 }).toBe(1);

    const first = await h.db
      .selectFrom('allocations')
      .where('id', '=', allocationId)
      .selectAll()
      .executeTakeFirstOrThrow();
    expect(first.state).toBe('failed');
    expect(first.released_at).not.toBeNull();
    const { rows } = await sql<{ live: number }>`
      SELECT count(*)::int AS live FROM device_bookings WHERE allocation_id = ${allocationId} AND upper(during) > compute_now()`.execute(
      h.db,
    );
    expect(rows[0]!.live).toBe(0);

    // Placed again (admission's placer) and bound this time.
    const second = await expect
      .poll(() => currentAllocation(id), { timeout: 30_000 })
      .toMatchObject({ state: 'binding' })
      .then(() => currentAllocation(id));
    expect(second!.id).not.toBe(allocationId);
    expect(await nodeAssignments(second!.node_id)).toContain(second!.id);
    expect(await nodeAssignments(h.nodes[0]!.id)).not.toContain(allocationId);
    await reportAllocation(h, id, second!.id, 'bound');
    await waitForState(h, id, 'active');
    const types = await eventTypes(h, id);
    expect(types).toEqual([
      'reservation.binding',
      'reservation.pending',
      'reservation.placed',
      'reservation.binding',
      'reservation.active',
    ]);
    expect(await pendingEventData(id)).toMatchObject({ reason: 'NodeDidNotBind' });
    await h.lifecycle.signal(id, { type: 'release' });
    await waitForState(h, id, 'released');
  });

  it('counts a failure report as a failed attempt (NodeRejectedBinding)', async () => {
    const { id, allocationId } = await insertPlacedReservation(h, { node: h.nodes[1]! });
    await start(id);
    await waitForState(h, id, 'binding');
    await reportAllocation(h, id, allocationId, 'failed');
    await expect.poll(() => bindAttempts(id), { timeout: 20_000 }).toBe(1);
    expect(await pendingEventData(id)).toMatchObject({ reason: 'NodeRejectedBinding' });
    await h.lifecycle.signal(id, { type: 'release' });
    await waitForState(h, id, ['released', 'cancelled']);
  });

  it('fails the reservation at the third failed attempt (BindTimeout), refunding its quota', async () => {
    const { id } = await insertPlacedReservation(h, { node: h.nodes[2]! });
    await h.db.updateTable('reservations').set({ bind_attempts: 2 }).where('id', '=', id).execute();
    await start(id);
    const failed = await waitForState(h, id, 'failed', 40_000);
    expect(failed.end_reason).toBe('bind-timeout');
    expect(failed.conditions).toContainEqual(
      expect.objectContaining({
        type: 'BindTimeout',
        reason: 'NodeDidNotBind',
        message: expect.stringContaining('3 of 3'),
      }),
    );
    expect(await eventTypes(h, id)).toEqual(['reservation.binding', 'reservation.failed']);
    expect(await quotaRefunded(h, id)).toBe(true);
  });

  it('marks an active reservation Degraded/BindingLost when a bound allocation is released, until bound again', async () => {
    const { id, allocationId } = await insertPlacedReservation(h, { node: h.nodes[3]! });
    await start(id);
    await waitForState(h, id, 'binding');
    await reportAllocation(h, id, allocationId, 'bound');
    await waitForState(h, id, 'active');

    // A report about an allocation this reservation does not own changes nothing.
    await h.lifecycle.signal(id, {
      type: 'allocationReport',
      allocationId: newId('alloc'),
      kind: 'released',
    });

    await reportAllocation(h, id, allocationId, 'released');
    const conditions = () => reservationConditions(h, id);
    await expect
      .poll(conditions, { timeout: 20_000 })
      .toContainEqual(expect.objectContaining({ type: 'Degraded', reason: 'BindingLost' }));
    expect((await waitForState(h, id, 'active')).state).toBe('active');

    await reportAllocation(h, id, allocationId, 'bound');
    await expect.poll(conditions, { timeout: 20_000 }).toEqual([]);
    await h.lifecycle.signal(id, { type: 'release' });
    await waitForState(h, id, 'released');
  });

  it('raises NodeUnreachable and AtomUnhealthy on an active reservation and never releases it for them', async () => {
    const node = h.nodes[0]!;
    const { id, allocationId } = await insertPlacedReservation(h, { node });
    await start(id);
    await waitForState(h, id, 'binding');
    await reportAllocation(h, id, allocationId, 'bound');
    await waitForState(h, id, 'active');
    await setNodeHealth(id, node, 'unreachable', 'unhealthy');
    const conditions = () => reservationConditions(h, id);
    await expect.poll(conditions, { timeout: 20_000 }).toEqual([
      expect.objectContaining({ type: 'Degraded', reason: 'AtomUnhealthy' }),
      expect.objectContaining({
        type: 'NodeUnreachable',
        reason: 'Unreachable',
        message: `not connected: ${node.id}`,
      }),
    ]);
    expect((await waitForState(h, id, 'active')).state).toBe('active');

    await setNodeHealth(id, node, 'connected', 'healthy');
    await expect.poll(conditions, { timeout: 20_000 }).toEqual([]);
    await h.lifecycle.signal(id, { type: 'release' });
    await waitForState(h, id, 'released');
  });
});
