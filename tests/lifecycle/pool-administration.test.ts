import { describe, expect, it } from 'vitest';
import { bootstrapPlatform } from '../../iam/bootstrap.ts';
import { seedPool, smallShape } from '../support/fleet.ts';
import {
  insertPlacedReservation,
  insertUnplacedReservation,
  type LifecycleHarness,
  reportAllocation,
  useLifecycleApi,
  waitForState,
} from './harness.ts';

// Long bind deadline and recheck: a reservation only moves when something wakes it.
const h = useLifecycleApi({ name: 'pool-admin', nodes: 1, timers: { bindTimeoutMs: 120_000 } });

async function root() {
  const { rootAdminToken } = await bootstrapPlatform(h.iam);
  return { token: rootAdminToken };
}

/** A pool of its own (two nodes), offered to the harness's tenant, as a harness over that pool. */
async function otherPool(name: string): Promise<LifecycleHarness> {
  const seeded = await seedPool(h.db, {
    siteId: h.siteId,
    name,
    nodes: 3,
    shape: smallShape,
    namePrefix: name,
    offers: { [h.tenantId]: { gpu: 64 } },
  });
  // What the reservation helpers read: the database, the tenant, the pool and its nodes.
  return { db: h.db, tenantId: h.tenantId, poolId: seeded.poolId, nodes: seeded.nodes } as LifecycleHarness;
}

/** One pending, one placed (future start) and one active reservation in the pool of `p`. */
async function threeReservations(p: LifecycleHarness) {
  const pending = await insertUnplacedReservation(p, { state: 'pending', gpus: 16 });
  const placed = await insertPlacedReservation(p, { node: p.nodes[0]!, startInMs: 3_600_000 });
  const active = await insertPlacedReservation(p, { node: p.nodes[1]! });
  const start = (id: string, state: string) =>
    h.lifecycle.start({ id, tenantId: h.tenantId, poolId: p.poolId, state });
  await start(pending, 'pending');
  await start(placed.id, 'placed');
  await start(active.id, 'placed');
  await waitForState(h, active.id, 'binding');
  await reportAllocation(h, active.id, active.allocationId, 'bound');
  await waitForState(h, active.id, 'active');
  await waitForState(h, placed.id, 'placed');
  return { pending, placed: placed.id, active: active.id };
}

function poolGone(row: { end_reason: string | null; conditions: unknown[] }) {
  expect(row.end_reason).toBe('pool-gone');
  expect(row.conditions).toContainEqual(
    expect.objectContaining({ type: 'Unschedulable', reason: 'PoolGone' }),
  );
}

const create = (poolId: string, key: string) =>
  h.compute.api.reservations.create(h.credential, {
    tenantId: h.tenantId,
    poolId,
    devices: [{ class: 'gpu', count: 1 }],
    duration: '1h',
    idempotencyKey: key,
  });

describe('pool administration', () => {
  it('sets a validated, versioned policy that the next decision uses', async () => {
    const admin = await root();
    const api = h.compute.api.admin;
    await expect(
      api.setPoolPolicy(admin, { poolId: h.poolId, policy: { spot: { noticeSecs: 30 } } as never }),
    ).rejects.toMatchObject({ code: 'INVALID_INPUT' });
    await expect(
      api.setPoolPolicy(admin, { poolId: h.poolId, policy: { timers: { bindTimeoutMs: -1 } } }),
    ).rejects.toMatchObject({ code: 'INVALID_INPUT' });
    await expect(api.setPoolPolicy(h.credential, { poolId: h.poolId, policy: {} })).rejects.toMatchObject({
      code: 'ACCESS_DENIED',
    });
    await expect(api.setPoolPolicy(admin, { poolId: 'pool_nope', policy: {} })).rejects.toMatchObject({
      code: 'NOT_FOUND',
    });

    const set = await api.setPoolPolicy(admin, {
      poolId: h.poolId,
      policy: {
        perGpu: { vcpu: 3, memoryGiB: 5 },
        spot: { noticeSeconds: 60 },
        calendar: { horizonDays: 30 },
      },
      expectedVersion: 1,
    });
    expect(set).toMatchObject({ policyVersion: 2, archived: false });
    await expect(
      api.setPoolPolicy(admin, { poolId: h.poolId, policy: {}, expectedVersion: 1 }),
    ).rejects.toMatchObject({ code: 'CONFLICT', details: { policyVersion: 2 } });

    // The next admission books the pool's new per-GPU share with the GPU.
    const reservation = await create(h.poolId, 'after-policy');
    const row = await h.db
      .selectFrom('reservations')
      .select('request')
      .where('id', '=', reservation.id)
      .executeTakeFirstOrThrow();
    expect((row.request as { resources: Record<string, number> }).resources).toMatchObject({
      vcpu: 3,
      memoryGiB: 5,
    });

    await api.setPoolPolicy(admin, { poolId: h.poolId, policy: { timers: { pendingRetryMs: 5_000 } } });
    const history = await api.poolPolicyHistory(admin, { poolId: h.poolId });
    expect(history.policyVersion).toBe(3);
    expect(history.policy).toEqual({ timers: { pendingRetryMs: 5_000 } });
    expect(history.versions.map((v) => v.version)).toEqual([3, 2]);
    expect(history.versions[1]!.policy).toMatchObject({ spot: { noticeSeconds: 60 } });
    const audit = await h.db
      .selectFrom('audit_events')
      .select(['actor_identity_id', 'context'])
      .where('resource_id', '=', h.poolId)
      .where('action', '=', 'compute:admin:set-pool-policy')
      .orderBy('id')
      .execute();
    expect(audit).toHaveLength(2);
    expect(audit[1]!.context).toMatchObject({ version: 3, previousVersion: 2 });
  });

  it('archiving a pool fails its pending and placed reservations with PoolGone; active ones run on', async () => {
    const admin = await root();
    const p = await otherPool('archived');
    const r = await threeReservations(p);
    const archived = await h.compute.api.admin.archivePool(admin, {
      poolId: p.poolId,
      reason: 'decommission',
    });
    expect(archived).toMatchObject({ archived: true, changed: true, reservationsEnding: 2 });
    poolGone(await waitForState(h, r.pending, 'failed'));
    poolGone(await waitForState(h, r.placed, 'failed'));
    const placedBookings = await h.db
      .selectFrom('device_bookings as b')
      .innerJoin('allocations as a', 'a.id', 'b.allocation_id')
      .where('a.reservation_id', '=', r.placed)
      .select('b.device_id')
      .execute();
    expect(placedBookings).toEqual([]);
    // The active one is woken too and still runs.
    await h.lifecycle.signal(r.active, { type: 'wake', reason: 'test' });
    expect((await waitForState(h, r.active, 'active')).state).toBe('active');
    await expect(create(p.poolId, 'into-archived')).rejects.toMatchObject({ code: 'NOT_FOUND' });
    const again = await h.compute.api.admin.archivePool(admin, { poolId: p.poolId });
    expect(again).toMatchObject({ changed: false, archivedAt: archived.archivedAt });
  });

  it("withdrawing an offer fails the tenant's pending and placed reservations there; active ones run on", async () => {
    const admin = await root();
    const p = await otherPool('withdrawn');
    const r = await threeReservations(p);
    const withdrawn = await h.compute.api.admin.withdrawOffer(admin, {
      poolId: p.poolId,
      tenantId: h.tenantId,
    });
    expect(withdrawn).toMatchObject({ reservationsEnding: 2 });
    poolGone(await waitForState(h, r.pending, 'failed'));
    poolGone(await waitForState(h, r.placed, 'failed'));
    await h.lifecycle.signal(r.active, { type: 'wake', reason: 'test' });
    expect((await waitForState(h, r.active, 'active')).state).toBe('active');
    await expect(create(p.poolId, 'after-withdraw')).rejects.toMatchObject({ code: 'NOT_FOUND' });
    await expect(
      h.compute.api.admin.withdrawOffer(admin, { poolId: p.poolId, tenantId: h.tenantId }),
    ).rejects.toMatchObject({ code: 'NOT_FOUND' });
    const audit = await h.db
      .selectFrom('audit_events')
      .select('context')
      .where('resource_id', '=', p.poolId)
      .where('action', '=', 'compute:admin:withdraw-offer')
      .execute();
    expect(audit).toEqual([{ context: expect.objectContaining({ offerTenantId: h.tenantId }) }]);
  });
});
