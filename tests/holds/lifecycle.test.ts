import { sql } from 'kysely';
import { describe, expect, it } from 'vitest';
import { advanceComputeClock } from '../../db/clock.ts';
import { bootstrapPlatform } from '../../iam/bootstrap.ts';
import { useLifecycleApi, waitForState } from '../lifecycle/harness.ts';
import { seedPool } from '../support/fleet.ts';
import { hostShape } from './fixture.ts';

// A short maxPending, so a reservation that can never fit fails for capacity within the test;
// the orphan sweeper's Schedule every second, so lapsed holds are announced.
const h = useLifecycleApi({
  name: 'holds-lifecycle',
  nodes: 1,
  timers: { maxPendingMs: 4_000, pendingRetryMs: 500 },
  sweeper: { everyMs: 1_000, graceMs: 500 },
});

describe('host holds and the demand ledger with the lifecycle on Temporal', () => {
  it('records a reservation that fails for want of capacity in the ledger when the lifecycle fails it, once', async () => {
    const created = await h.compute.api.reservations.create(h.credential, {
      tenantId: h.tenantId,
      poolId: h.poolId,
      devices: [{ class: 'gpu', count: 16 }],
      duration: '1h',
      idempotencyKey: 'never-fits',
    });
    expect(created.state).toBe('pending');
    const entry = () =>
      h.db
        .selectFrom('unmet_demand')
        .select(['reason', 'message'])
        .where('subject_id', '=', created.id)
        .execute();
    expect(await entry()).toEqual([expect.objectContaining({ reason: 'pending' })]);

    const failed = await waitForState(h, created.id, 'failed', 45_000);
    expect(failed.end_reason).toBe('max-pending-exceeded');
    // Written by the transaction that failed it: the stored row says so, nothing derives it.
    expect(await entry()).toEqual([
      { reason: 'failed-capacity', message: "pending longer than the pool's maxPending of 4000 ms" },
    ]);
    const report = await h.compute.api.capacity.demand(h.credential, {
      tenantId: h.tenantId,
      poolId: h.poolId,
    });
    expect(report.total).toBe(1);
    expect(report.byReason).toEqual([{ key: 'failed-capacity', count: 1 }]);
  });

  it('announces a hold that lapsed without a release once (hold.expired, by the sweeper), then retires it after its hour', async () => {
    const boot = await bootstrapPlatform(h.iam);
    const admin = { token: boot.rootAdminToken };
    // A host that publishes its cores and GiB, in a pool of its own offered to the tenant.
    const seeded = await seedPool(h.db, {
      siteId: h.siteId,
      name: 'hosts',
      namePrefix: 'host',
      ownerTenantId: boot.rootTenantId,
      nodes: 1,
      shape: hostShape(1, 8, 32),
      offers: { [h.tenantId]: { gpu: 8, vcpu: 64, memoryGiB: 256 } },
    });
    await h.compute.api.holds['kinds.set'](admin, {
      tenantId: boot.rootTenantId,
      pool: seeded.poolId,
      name: 'diagnostics',
      cpuCores: 1,
      ramGiB: 1,
    });
    const hold = await h.compute.api.holds.create(h.credential, {
      tenantId: h.tenantId,
      target: seeded.nodes[0]!.id,
      kind: 'diagnostics',
      ttlSeconds: 30,
    });
    const events = async () =>
      (
        await h.db
          .selectFrom('outbox_events')
          .select(['type', 'data'])
          .where('subject', '=', `hold/${hold.id}`)
          .orderBy('seq')
          .execute()
      ).map((e) => e.type);
    expect(await events()).toEqual(['hold.created']);

    await advanceComputeClock(h.db, 31_000);
    await expect.poll(events, { timeout: 30_000, interval: 250 }).toEqual(['hold.created', 'hold.expired']);
    // Further sweeps find nothing more to say: the run after the next one has come and gone.
    const runs = async () => {
      const { rows } = await sql<{ n: string }>`
        SELECT count(*) AS n FROM outbox_events WHERE subject = ${`hold/${hold.id}`}`.execute(h.db);
      return Number(rows[0]!.n);
    };
    await new Promise((resolve) => setTimeout(resolve, 2_500)); // absence of an effect: two more runs
    expect(await runs()).toBe(2);

    // Past the hour it stays listed, the sweeper retires it.
    await advanceComputeClock(h.db, 3_601_000);
    await expect
      .poll(
        async () =>
          (await h.db.selectFrom('host_holds').select('id').where('id', '=', hold.id).execute()).length,
        { timeout: 30_000, interval: 250 },
      )
      .toBe(0);
  });
});
