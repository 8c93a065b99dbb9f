import { describe, expect, it } from 'vitest';
import {
  eventTypes,
  insertPlacedReservation,
  insertUnplacedReservation,
  quotaRefunded,
  reportAllocation,
  useLifecycleHarness,
  waitForState,
} from './harness.ts';

const h = useLifecycleHarness({ name: 'cancel-release', nodes: 4 });

const start = (id: string, state: string) => h.startLifecycle(id, state);

describe('cancel and release from each state', () => {
  it('cancels or releases a pending reservation (release of a pending one cancels it)', async () => {
    // More GPUs than any node has: they stay pending however often the placer tries.
    const a = await insertUnplacedReservation(h, { state: 'pending', gpus: 16 });
    const b = await insertUnplacedReservation(h, { state: 'pending', gpus: 16 });
    await start(a, 'pending');
    await start(b, 'pending');
    await h.lifecycle.signal(a, { type: 'cancel' });
    await h.lifecycle.signal(b, { type: 'release' });
    expect((await waitForState(h, a, 'cancelled')).end_reason).toBe('cancel');
    expect((await waitForState(h, b, 'cancelled')).end_reason).toBe('cancel');
    expect(await eventTypes(h, a)).toContain('reservation.cancelled');
  });

  it('cancels and releases a placed reservation before its start', async () => {
    const a = await insertPlacedReservation(h, { node: h.nodes[0]!, startInMs: 3_600_000 });
    const b = await insertPlacedReservation(h, { node: h.nodes[1]!, startInMs: 3_600_000 });
    await start(a.id, 'placed');
    await start(b.id, 'placed');
    await h.lifecycle.signal(a.id, { type: 'cancel' });
    await h.lifecycle.signal(b.id, { type: 'release' });
    expect(await waitForState(h, a.id, 'cancelled')).toMatchObject({ end_reason: 'cancel' });
    expect(await waitForState(h, b.id, 'released')).toMatchObject({ end_reason: 'release' });
    expect(await quotaRefunded(h, a.id)).toBe(true);
    // Future bookings are deleted, not truncated.
    const left = await h.db
      .selectFrom('device_bookings')
      .where('allocation_id', 'in', [a.allocationId, b.allocationId])
      .selectAll()
      .execute();
    expect(left).toEqual([]);
  });

  it('refuses to cancel a binding or active reservation, and releases both', async () => {
    const binding = await insertPlacedReservation(h, { node: h.nodes[2]! });
    const active = await insertPlacedReservation(h, { node: h.nodes[3]! });
    await start(binding.id, 'placed');
    await start(active.id, 'placed');
    await waitForState(h, binding.id, 'binding');
    await waitForState(h, active.id, 'binding');
    await reportAllocation(h, active.id, active.allocationId, 'bound');
    await waitForState(h, active.id, 'active');

    await expect(h.lifecycle.signal(binding.id, { type: 'cancel' })).rejects.toMatchObject({
      code: 'INVALID_STATE',
    });
    await expect(h.lifecycle.signal(active.id, { type: 'cancel' })).rejects.toMatchObject({
      code: 'INVALID_STATE',
    });
    expect((await waitForState(h, active.id, 'active')).state).toBe('active');

    await h.lifecycle.signal(binding.id, { type: 'release' });
    await h.lifecycle.signal(active.id, { type: 'release' });
    expect(await waitForState(h, binding.id, 'released')).toMatchObject({ end_reason: 'release' });
    expect(await waitForState(h, active.id, 'released')).toMatchObject({ end_reason: 'release' });
    expect(await quotaRefunded(h, active.id)).toBe(true);
    await expect(h.lifecycle.signal(active.id, { type: 'release' })).rejects.toMatchObject({
      code: 'INVALID_STATE',
    });
  });

  it('cancels a reservation awaiting confirmation', async () => {
    const id = await insertUnplacedReservation(h, { state: 'awaiting-confirmation' });
    await start(id, 'awaiting-confirmation');
    await h.lifecycle.signal(id, { type: 'cancel' });
    expect((await waitForState(h, id, 'cancelled')).end_reason).toBe('cancel');
  });
});
