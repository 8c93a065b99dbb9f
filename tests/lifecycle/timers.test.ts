import { sql } from 'kysely';
import { describe, expect, it } from 'vitest';
import { snapshotQuery } from '../../workflows/reservation/messages.ts';
import { eventually } from '../support/eventually.ts';
import {
  eventTypes,
  insertPlacedReservation,
  reportAllocation,
  useLifecycleHarness,
  waitForState,
} from './harness.ts';

const h = useLifecycleHarness({ name: 'timers', nodes: 3 });

const start = (id: string) => h.startLifecycle(id);

/** When the reservation.released event was written (the database's clock). */
async function releasedAt(id: string): Promise<Date> {
  const row = await h.db
    .selectFrom('outbox_events')
    .where('subject', '=', `reservation/${id}`)
    .where('type', '=', 'reservation.released')
    .select('created_at')
    .executeTakeFirstOrThrow();
  return row.created_at;
}

describe('the moments a lifecycle owns', () => {
  it('releases with lease-lapsed when the lease runs out, and renew moves the deadline first', async () => {
    const { id } = await insertPlacedReservation(h, {
      node: h.nodes[0]!,
      startInMs: 3_600_000,
      // Long enough that the renew below always comes before the first deadline, however slow
      // the machine; the wait before it only makes the second deadline measurably later.
      leaseSeconds: 6,
    });
    await start(id);
    await new Promise((r) => setTimeout(r, 1_000));
    const before = await h.db
      .selectFrom('reservations')
      .where('id', '=', id)
      .select('lease_expires_at')
      .executeTakeFirstOrThrow();
    const renewed = await h.lifecycle.renew(id);
    expect(renewed.leaseExpiresAt.getTime()).toBeGreaterThan(before.lease_expires_at!.getTime());
    const released = await waitForState(h, id, 'released', 40_000);
    expect(released.end_reason).toBe('lease-lapsed');
    // It lapsed at the renewed deadline, not the first one (both on the database's clock).
    expect((await releasedAt(id)).getTime()).toBeGreaterThanOrEqual(renewed.leaseExpiresAt.getTime());
    expect(await eventTypes(h, id)).toEqual(['reservation.released']);
    // Renewing a terminal reservation is INVALID_STATE.
    await expect(h.lifecycle.renew(id)).rejects.toMatchObject({ code: 'INVALID_STATE' });
  });

  it('refuses to renew a reservation created without a lease (the validator keeps it out of history)', async () => {
    const { id } = await insertPlacedReservation(h, { node: h.nodes[1]!, startInMs: 3_600_000 });
    await start(id);
    const handle = h.temporal.client.workflow.getHandle(id);
    await expect.poll(() => handle.query(snapshotQuery), { timeout: 20_000 }).not.toBeNull();
    await expect(h.lifecycle.renew(id)).rejects.toMatchObject({ code: 'INVALID_STATE' });
    const history = await handle.fetchHistory();
    const updates = (history.events ?? []).filter((e) => e.workflowExecutionUpdateAcceptedEventAttributes);
    expect(updates).toHaveLength(0);
    await h.lifecycle.signal(id, { type: 'cancel' });
    expect((await waitForState(h, id, 'cancelled')).end_reason).toBe('cancel');
  });

  it('ends an active reservation at its end (expired), and an extend moves that end', async () => {
    // Long enough to bind and report before the end, and an extension long enough to look at it
    // between the two ends, on a loaded machine.
    const { id, allocationId } = await insertPlacedReservation(h, { node: h.nodes[2]!, durationMs: 8_000 });
    await start(id);
    await waitForState(h, id, 'binding');
    await reportAllocation(h, id, allocationId, 'bound');
    await waitForState(h, id, 'active');
    // What admission's extend commits: the window and the bookings end 6 s later.
    const { rows } = await sql<{ end: Date }>`
      UPDATE reservations SET during = tstzrange(lower(during), upper(during) + interval '6 seconds', '[)'),
        version = version + 1 WHERE id = ${id} RETURNING upper(during) AS end`.execute(h.db);
    await sql`UPDATE allocations SET during = tstzrange(lower(during), upper(during) + interval '6 seconds', '[)') WHERE id = ${allocationId}`.execute(
      h.db,
    );
    await sql`UPDATE device_bookings SET during = tstzrange(lower(during), upper(during) + interval '6 seconds', '[)') WHERE allocation_id = ${allocationId}`.execute(
      h.db,
    );
    const newEnd = rows[0]!.end.getTime();
    await h.lifecycle.signal(id, { type: 'extended', end: newEnd });
    // Past the old end (and a moment for a timer set on it to have fired), it is still active.
    const oldEnd = newEnd - 6_000;
    await eventually(async () => {
      const now = await sql<{ now: Date }>`SELECT compute_now() AS now`.execute(h.db);
      return now.rows[0]!.now.getTime() >= oldEnd + 1_500;
    }, 30_000);
    expect((await waitForState(h, id, 'active')).state).toBe('active');
    const released = await waitForState(h, id, 'released', 40_000);
    expect(released.end_reason).toBe('expired');
    expect((await releasedAt(id)).getTime()).toBeGreaterThanOrEqual(newEnd);
  });
});
