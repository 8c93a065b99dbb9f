import { describe, expect, it } from 'vitest';
import { insertPlacedReservation, useLifecycleHarness, waitForState } from './harness.ts';

const h = useLifecycleHarness({ name: 'history-bound', nodes: 1, historyLimit: 40 });

describe('bounded history', () => {
  it('continues as new while a reservation is renewed again and again, keeping its lease and its state', async () => {
    const { id } = await insertPlacedReservation(h, { startInMs: 3_600_000, leaseSeconds: 30 });
    await h.startLifecycle(id);
    await waitForState(h, id, 'placed');
    const handle = h.temporal.client.workflow.getHandle(id);
    const firstRun = (await handle.describe()).runId;
    let last = 0;
    for (let i = 0; i < 15; i++) {
      const { leaseExpiresAt } = await h.lifecycle.renew(id);
      expect(leaseExpiresAt.getTime()).toBeGreaterThanOrEqual(last);
      last = leaseExpiresAt.getTime();
    }
    const described = await handle.describe();
    expect(described.runId).not.toBe(firstRun);
    expect(described.historyLength).toBeLessThan(120);
    await h.lifecycle.signal(id, { type: 'cancel' });
    expect((await waitForState(h, id, 'cancelled')).end_reason).toBe('cancel');
  });
});
