import { sql } from 'kysely';
import { describe, expect, it } from 'vitest';
import { checkBookingInvariants } from '../../db/allocations/invariants.ts';
import { advanceComputeClock, readComputeNow } from '../../db/clock.ts';
import { setOperatorLabels } from '../../db/nodes/labels.ts';
import { useLifecycleApi } from '../lifecycle/harness.ts';

/**
 * BookingRepair of a calendar gang on the real PostgreSQL and Temporal: a member whose node is
 * cordoned after admission is moved 15 minutes before the start (the compute clock is moved
 * there) as the same member, on the gang's topology value; when no node of that value is left the
 * failed repair is published on its own with the placer's summary.
 */
const h = useLifecycleApi({
  name: 'calendar-gang-repair',
  nodes: 4,
  timers: { preStartMs: 15 * 60_000, recheckMs: 1_000, bindTimeoutMs: 600_000, pendingRetryMs: 1_000 },
  pool: { ownerTenantId: 'platform', gpuQuota: 64 },
});

const hour = 3_600_000;
const key = 'fabric.domain';

async function eventsOf(id: string, type: string) {
  return h.db
    .selectFrom('outbox_events')
    .where('subject', '=', `reservation/${id}`)
    .where('type', '=', type)
    .select('data')
    .orderBy('seq')
    .execute();
}

/** The current members: allocation, node, gang_index, member_attempt. */
async function members(reservationId: string) {
  return h.db
    .selectFrom('allocations')
    .where('reservation_id', '=', reservationId)
    .where('superseded_at', 'is', null)
    .select(['id', 'node_id', 'gang_index', 'member_attempt'])
    .orderBy('gang_index')
    .execute();
}

const cordon = (nodeId: string) =>
  h.db.updateTable('nodes').set({ cordoned: true }).where('id', '=', nodeId).execute();

describe('BookingRepair of a calendar gang', () => {
  it('moves the member on a cordoned node as the same member on the same topology value, and publishes a failure', async () => {
    // fabric-a: three nodes (a gang of 2 fits there with one spare); fabric-b: one node.
    const [a0, a1, a2, b0] = h.nodes.map((n) => n.id) as [string, string, string, string];
    await setOperatorLabels(h.db, [
      { nodeId: a0, key, value: 'fabric-a' },
      { nodeId: a1, key, value: 'fabric-a' },
      { nodeId: a2, key, value: 'fabric-a' },
      { nodeId: b0, key, value: 'fabric-b' },
    ]);
    const now = (await readComputeNow(h.db)).getTime();
    const start = now + 2 * hour;
    const created = await h.compute.api.reservations.create(h.credential, {
      tenantId: 'acme',
      poolId: h.poolId,
      devices: [{ class: 'gpu', count: 2 }],
      duration: '1h',
      start,
      gang: { size: 2, topologyKey: key },
      idempotencyKey: 'gang-calendar',
    });
    expect(created.state).toBe('placed');
    expect(created.gang).toMatchObject({ size: 2, topologyValue: 'fabric-a' });
    const before = await members(created.id);
    expect(before.map((m) => m.gang_index)).toEqual([0, 1]);
    const spare = [a0, a1, a2].find((n) => !before.some((m) => m.node_id === n))!;
    // Member 1 was re-placed once before (its count must carry over); its node is cordoned.
    const moving = before[1]!;
    await h.db.updateTable('allocations').set({ member_attempt: 1 }).where('id', '=', moving.id).execute();
    await cordon(moving.node_id);

    await advanceComputeClock(h.db, 2 * hour - 14 * 60_000);
    await expect
      .poll(async () => (await eventsOf(created.id, 'reservation.repaired')).length, { timeout: 60_000 })
      .toBe(1);
    const [repaired] = await eventsOf(created.id, 'reservation.repaired');
    const moves = (repaired!.data as { moves: Array<Record<string, unknown>> }).moves;
    expect(moves).toEqual([
      expect.objectContaining({
        gangIndex: 1,
        fromNodeId: moving.node_id,
        toNodeId: spare,
        reason: 'cordoned',
      }),
    ]);
    const after = await members(created.id);
    expect(after).toEqual([
      expect.objectContaining({ node_id: before[0]!.node_id, gang_index: 0, member_attempt: 0 }),
      expect.objectContaining({ node_id: spare, gang_index: 1, member_attempt: 1 }),
    ]);
    // Never two current members on one node, and the gang stays on its value.
    expect(new Set(after.map((m) => m.node_id)).size).toBe(2);
    const view = await h.compute.api.reservations.get(h.credential, {
      tenantId: 'acme',
      reservationId: created.id,
    });
    expect(view.gang).toMatchObject({ topologyValue: 'fabric-a' });
    const windows = await sql<{ start: Date; end: Date }>`
      SELECT lower(b.during) AS start, upper(b.during) AS "end" FROM device_bookings b
      JOIN allocations a ON a.id = b.allocation_id
      WHERE a.reservation_id = ${created.id} AND a.superseded_at IS NULL`.execute(h.db);
    expect(windows.rows).toHaveLength(4);
    expect(windows.rows.every((w) => w.start.getTime() === start && w.end.getTime() === start + hour)).toBe(
      true,
    );
    expect(await checkBookingInvariants(h.db)).toEqual({ deviceOverlaps: 0, scalarOverbookings: 0 });

    // Member 0's node is cordoned too: fabric-a has no node left (fabric-b is never taken), so the
    // repair at the start fails, says why in an event of its own, and the gang goes back to pending.
    await cordon(before[0]!.node_id);
    await advanceComputeClock(h.db, 15 * 60_000);
    await expect
      .poll(async () => (await eventsOf(created.id, 'reservation.repair-failed')).length, { timeout: 60_000 })
      .toBe(1);
    const [failed] = await eventsOf(created.id, 'reservation.repair-failed');
    expect(failed!.data).toMatchObject({
      moment: 'start',
      state: 'pending',
      bad: [expect.objectContaining({ nodeId: before[0]!.node_id, reason: 'cordoned' })],
      message: expect.stringMatching(/BookingRepair found no place/),
    });
    expect((failed!.data as { summary: string }).summary.length).toBeGreaterThan(0);
    expect(await members(created.id)).toEqual([]);
    await h.compute.api.reservations.release(h.credential, { tenantId: 'acme', reservationId: created.id });
  });
});
