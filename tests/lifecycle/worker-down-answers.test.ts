import { describe, expect, it } from 'vitest';
import { afterCommitWaitMs } from '../../api/reservations/access.ts';
import { useLifecycleApi, waitForState } from './harness.ts';

// A long bind deadline: with no daemon the reservation stays binding while the worker is away.
// A short activity timeout: a step the stopped worker left in flight is retried soon after it is back.
const h = useLifecycleApi({
  name: 'worker-down',
  nodes: 1,
  timers: { bindTimeoutMs: 300_000 },
  activityTimeoutMs: 5_000,
});

describe('answers while the worker is down', () => {
  it('renews a lease in PostgreSQL and answers within the after-commit bound; the lifecycle catches up', async () => {
    const created = await h.compute.api.reservations.create(h.credential, {
      tenantId: h.tenantId,
      poolId: h.poolId,
      devices: [{ class: 'gpu', count: 1 }],
      duration: '1h',
      leaseSeconds: 600,
      idempotencyKey: 'lease-worker-down',
    });
    await waitForState(h, created.id, 'binding');
    await h.worker!.stop();
    h.worker = null;
    const before = await h.db
      .selectFrom('reservations')
      .select(['lease_expires_at', 'version'])
      .where('id', '=', created.id)
      .executeTakeFirstOrThrow();
    // wall time: how long the answer took, the property under test
    const started = Date.now();
    const renewed = await h.compute.api.reservations.renew(h.credential, {
      tenantId: h.tenantId,
      reservationId: created.id,
    });
    const took = Date.now() - started;
    expect(took).toBeLessThan(afterCommitWaitMs + 4_000);
    expect(renewed.state).toBe('binding');
    const after = await h.db
      .selectFrom('reservations')
      .select(['lease_expires_at', 'version'])
      .where('id', '=', created.id)
      .executeTakeFirstOrThrow();
    expect(after.version).toBeGreaterThan(before.version);
    expect(after.lease_expires_at!.getTime()).toBeGreaterThanOrEqual(before.lease_expires_at!.getTime());

    // Back up, the lifecycle reads the renewed lease and still holds the reservation.
    await h.startWorker();
    const handle = h.temporal.client.workflow.getHandle(created.id);
    await expect
      .poll(async () => (await handle.query('snapshot')) as { leaseExpiresAt: number } | null, {
        // The new worker bundles its workflows and the sticky task of the old one times out first.
        timeout: 60_000,
      })
      .toMatchObject({ leaseExpiresAt: after.lease_expires_at!.getTime() });
    await h.compute.api.reservations.release(h.credential, {
      tenantId: h.tenantId,
      reservationId: created.id,
    });
    await waitForState(h, created.id, 'released');
  });
});
