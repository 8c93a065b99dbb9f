import { describe, expect, it } from 'vitest';
import {
  eventTypes,
  insertPlacedReservation,
  insertUnplacedReservation,
  useLifecycleHarness,
  waitForState,
} from './harness.ts';

const h = useLifecycleHarness({
  name: 'pending',
  nodes: 1,
  // maxPending leaves the first test room to release the holder and place the waiting one
  // before it fires, on a loaded machine; the second test waits it out.
  timers: { maxPendingMs: 20_000, pendingRetryMs: 500 },
});

const start = (id: string, state: string) => h.startLifecycle(id, state);

describe('pending reservations', () => {
  it('are placed as soon as a release frees the capacity they wait for', async () => {
    const holder = await insertPlacedReservation(h, { startInMs: 0 });
    const waiting = await insertUnplacedReservation(h, { state: 'pending', gpus: 2 });
    await start(waiting, 'pending');
    // Absence of an effect: a few retries (every 500 ms) find nothing free.
    await new Promise((r) => setTimeout(r, 1_200));
    expect((await waitForState(h, waiting, 'pending')).state).toBe('pending');
    // The holder's lifecycle never ran; releasing it through the workflow frees the node.
    await start(holder.id, 'placed');
    await h.lifecycle.signal(holder.id, { type: 'release' });
    await waitForState(h, waiting, ['placed', 'binding']);
    expect(await eventTypes(h, waiting)).toContain('reservation.placed');
    await h.lifecycle.signal(waiting, { type: 'release' });
    await waitForState(h, waiting, 'released');
  });

  it('fail with Unschedulable/MaxPendingExceeded past maxPending', async () => {
    const id = await insertUnplacedReservation(h, { state: 'pending', gpus: 16 });
    await start(id, 'pending');
    const failed = await waitForState(h, id, 'failed', 45_000);
    expect(failed.end_reason).toBe('max-pending-exceeded');
    expect(failed.conditions).toContainEqual(
      expect.objectContaining({ type: 'Unschedulable', reason: 'MaxPendingExceeded' }),
    );
    expect(await eventTypes(h, id)).toEqual(['reservation.failed']);
  });
});
