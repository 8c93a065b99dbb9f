import { sql } from 'kysely';
import { describe, expect, it } from 'vitest';
import { snapshotQuery } from '../../workflows/reservation/messages.ts';
import {
  eventTypes,
  insertPlacedReservation,
  reportAllocation,
  useLifecycleHarness,
  waitForState,
} from './harness.ts';

const h = useLifecycleHarness({ name: 'timers', nodes: 3 });

const start = (id: string) => h.startLifecycle(id);

describe('the moments a lifecycle owns', () => {
  it('releases with lease-lapsed when the lease runs out, and renew moves the deadline first', async () => {
    const { id } = await insertPlacedReservation(h, {
      node: h.nodes[0]!,
      startInMs: 3_600_000,
      leaseSeconds: 2,
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
    const began = Date.now();
    const released = await waitForState(h, id, 'released', 10_000);
    expect(released.end_reason).toBe('lease-lapsed');
    expect(Date.now() - began).toBeGreaterThan(1_200);
    expect(await eventTypes(h, id)).toEqual(['reservation.released']);
    // Renewing a terminal reservation is INVALID_STATE.
    await expect(h.lifecycle.renew(id)).rejects.toMatchObject({ code: 'INVALID_STATE' });
  });

  it('refuses to renew a reservation created without a lease (the validator keeps it out of history)', async () => {
    const { id } = await insertPlacedReservation(h, { node: h.nodes[1]!, startInMs: 3_600_000 });
    await start(id);
    const handle = h.temporal.client.workflow.getHandle(id);
    await expect.poll(() => handle.query(snapshotQuery), { timeout: 5_000 }).not.toBeNull();
    await expect(h.lifecycle.renew(id)).rejects.toMatchObject({ code: 'INVALID_STATE' });
    const history = await handle.fetchHistory();
    const updates = (history.events ?? []).filter((e) => e.workflowExecutionUpdateAcceptedEventAttributes);
    expect(updates).toHaveLength(0);
    await h.lifecycle.signal(id, { type: 'cancel' });
    expect((await waitForState(h, id, 'cancelled')).end_reason).toBe('cancel');
  });

  it('ends an active reservation at its end (expired), and an extend moves that end', async () => {
    const { id, allocationId } = await insertPlacedReservation(h, { node: h.nodes[2]!, durationMs: 2_500 });
    await start(id);
    await waitForState(h, id, 'binding');
    await reportAllocation(h, id, allocationId, 'bound');
    await waitForState(h, id, 'active');
    // What admission's extend commits: the window and the bookings end 3 s later.
    const { rows } = await sql<{ end: Date }>`
      UPDATE reservations SET during = tstzrange(lower(during), upper(during) + interval '3 seconds', '[)'),
        version = version + 1 WHERE id = ${id} RETURNING upper(during) AS end`.execute(h.db);
    await sql`UPDATE allocations SET during = tstzrange(lower(during), upper(during) + interval '3 seconds', '[)') WHERE id = ${allocationId}`.execute(
      h.db,
    );
    await sql`UPDATE device_bookings SET during = tstzrange(lower(during), upper(during) + interval '3 seconds', '[)') WHERE allocation_id = ${allocationId}`.execute(
      h.db,
    );
    const newEnd = rows[0]!.end.getTime();
    await h.lifecycle.signal(id, { type: 'extended', end: newEnd });
    await new Promise((r) => setTimeout(r, 1_500));
    expect((await waitForState(h, id, 'active')).state).toBe('active');
    const released = await waitForState(h, id, 'released', 10_000);
    expect(released.end_reason).toBe('expired');
    const now = await sql<{ now: Date }>`SELECT compute_now() AS now`.execute(h.db);
    expect(now.rows[0]!.now.getTime()).toBeGreaterThanOrEqual(newEnd);
  });
});
