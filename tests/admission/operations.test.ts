import { sql } from 'kysely';
import { beforeAll, describe, expect, it } from 'vitest';
import { insertDeviceBookings } from '../../db/allocations/bookings.ts';
import { checkBookingInvariants } from '../../db/allocations/invariants.ts';
import { advanceComputeClock } from '../../db/clock.ts';
import { insertBareAllocation } from '../support/allocations.ts';
import { h100Pool, type TenantFixture, tenantWithMember } from './fixtures.ts';
import { useAdmissionHarness } from './harness.ts';

const h = useAdmissionHarness();
let acme: TenantFixture;
let acme2: TenantFixture;
let poolId: string;
let otherPoolId: string;
const hour = 3_600_000;

const create = (token: string, key: string, extra: Record<string, unknown> = {}) =>
  h.call(token, 'reservations/create', {
    tenantId: 'acme',
    poolId,
    devices: [{ class: 'gpu', count: 8 }],
    duration: '2h',
    idempotencyKey: key,
    ...extra,
  });

async function quotaUsed(pool = poolId) {
  const { rows } = await sql<{
    used: string;
  }>`SELECT used FROM quotas WHERE tenant_id = 'acme' AND pool_id = ${pool} AND resource = 'gpu'`.execute(
    h.t.db,
  );
  return Number(rows[0]!.used);
}

beforeAll(async () => {
  acme = await tenantWithMember(h, 'acme');
  acme2 = await tenantWithMember(h, 'acme', { name: 'acme-two' });
  poolId = (await h100Pool(h, { nodes: 2, tenants: ['acme'], gpuQuota: 64 })).poolId;
  otherPoolId = (await h100Pool(h, { nodes: 1, tenants: ['acme'], gpuQuota: 64, name: 'other' })).poolId;
});

describe('reservations.get and list', () => {
  it('lists mine by default, all with scope, newest first, filtered and paged', async () => {
    const a = await create(acme.token, 'list-a', { devices: [{ class: 'gpu', count: 1 }] });
    const b = await create(acme.token, 'list-b', {
      devices: [{ class: 'gpu', count: 1 }],
      poolId: otherPoolId,
    });
    const c = await create(acme2.token, 'list-c', { devices: [{ class: 'gpu', count: 1 }] });
    const ids = (res: { body: any }) => res.body.data.reservations.map((r: { id: string }) => r.id);
    const mine = await h.call(acme.token, 'reservations/list', { tenantId: 'acme' });
    expect(ids(mine)).toEqual([b.body.data.id, a.body.data.id]);
    const all = await h.call(acme.token, 'reservations/list', { tenantId: 'acme', scope: 'all' });
    expect(ids(all)).toEqual([c.body.data.id, b.body.data.id, a.body.data.id]);
    const inPool = await h.call(acme.token, 'reservations/list', {
      tenantId: 'acme',
      scope: 'all',
      poolId: otherPoolId,
    });
    expect(ids(inPool)).toEqual([b.body.data.id]);
    const page1 = await h.call(acme.token, 'reservations/list', { tenantId: 'acme', scope: 'all', limit: 2 });
    expect(ids(page1)).toEqual([c.body.data.id, b.body.data.id]);
    const page2 = await h.call(acme.token, 'reservations/list', {
      tenantId: 'acme',
      scope: 'all',
      limit: 2,
      cursor: page1.body.data.nextCursor,
    });
    expect(ids(page2)).toEqual([a.body.data.id]);
    expect(page2.body.data.nextCursor).toBeNull();
    const placed = await h.call(acme.token, 'reservations/list', {
      tenantId: 'acme',
      scope: 'all',
      state: 'released',
    });
    expect(ids(placed)).toEqual([]);
    for (const bad of [{ limit: 0 }, { limit: 201 }, { scope: 'everyone' }, { state: 'draft' }]) {
      const res = await h.call(acme.token, 'reservations/list', { tenantId: 'acme', ...bad });
      expect(res.body.error.code).toBe('INVALID_INPUT');
    }
    const got = await h.call(acme.token, 'reservations/get', {
      tenantId: 'acme',
      reservationId: a.body.data.id,
    });
    expect(got.body.data).toEqual(a.body.data);
    const missing = await h.call(acme.token, 'reservations/get', {
      tenantId: 'acme',
      reservationId: 'rsv_nope',
    });
    expect(missing).toMatchObject({ status: 404, body: { error: { code: 'NOT_FOUND' } } });
    for (const r of [a, b, c])
      await h.call(acme.token, 'reservations/release', { tenantId: 'acme', reservationId: r.body.data.id });
  });
});

describe('reservations.release and cancel', () => {
  it('truncates the booking at compute_now(), refunds quota once, signals and wakes the pool', async () => {
    const r = (await create(acme.token, 'release-1')).body.data;
    expect(await quotaUsed()).toBe(8);
    await advanceComputeClock(h.t.db, 30 * 60_000);
    const released = await h.call(acme.token, 'reservations/release', {
      tenantId: 'acme',
      reservationId: r.id,
    });
    expect(released.body.data).toMatchObject({
      state: 'released',
      endReason: 'release',
      operation: { state: 'succeeded' },
    });
    const { rows } = await sql<{
      e: Date;
      now: Date;
    }>`SELECT upper(b.during) AS e, compute_now() AS now FROM device_bookings b JOIN allocations a ON a.id = b.allocation_id WHERE a.reservation_id = ${r.id}`.execute(
      h.t.db,
    );
    expect(rows).toHaveLength(8);
    for (const row of rows) expect(Math.abs(row.e.getTime() - row.now.getTime())).toBeLessThan(1_000);
    expect(released.body.data.during.end - released.body.data.during.start).toBeLessThan(31 * 60_000);
    expect(await quotaUsed()).toBe(0);
    expect(h.lifecycle.signals).toContainEqual({ reservationId: r.id, signal: { type: 'release' } });
    expect(h.lifecycle.wokenPools).toContain(poolId);
    // Releasing a terminal reservation changes nothing.
    const again = await h.call(acme.token, 'reservations/release', { tenantId: 'acme', reservationId: r.id });
    expect(again.body.data.version).toBe(released.body.data.version);
    expect(await quotaUsed()).toBe(0);
    // The freed GPUs are bookable at once.
    const next = await create(acme.token, 'release-2', { devices: [{ class: 'gpu', count: 8 }] });
    expect(next.body.data.state).toBe('placed');
    await h.call(acme.token, 'reservations/release', { tenantId: 'acme', reservationId: next.body.data.id });
  });

  it('deletes future bookings, cancels pending reservations, and refuses to cancel a started one', async () => {
    const { rows } = await sql<{ now: Date }>`SELECT compute_now() AS now`.execute(h.t.db);
    const future = (await create(acme.token, 'cancel-1', { start: rows[0]!.now.getTime() + 10 * hour })).body
      .data;
    const cancelled = await h.call(acme.token, 'reservations/cancel', {
      tenantId: 'acme',
      reservationId: future.id,
    });
    expect(cancelled.body.data).toMatchObject({
      state: 'cancelled',
      operation: { state: 'failed', error: { code: 'INVALID_STATE' } },
    });
    const { rows: left } = await sql<{
      n: string;
    }>`SELECT count(*) AS n FROM device_bookings b JOIN allocations a ON a.id = b.allocation_id WHERE a.reservation_id = ${future.id}`.execute(
      h.t.db,
    );
    expect(Number(left[0]!.n)).toBe(0);

    const active = (await create(acme.token, 'cancel-2')).body.data;
    await sql`UPDATE reservations SET state = 'active' WHERE id = ${active.id}`.execute(h.t.db);
    const refused = await h.call(acme.token, 'reservations/cancel', {
      tenantId: 'acme',
      reservationId: active.id,
    });
    expect(refused).toMatchObject({ status: 409, body: { error: { code: 'INVALID_STATE' } } });
    await h.call(acme.token, 'reservations/release', { tenantId: 'acme', reservationId: active.id });

    const blockers = [
      (await create(acme.token, 'cancel-3')).body.data,
      (await create(acme.token, 'cancel-4')).body.data,
    ];
    const pending = (await create(acme.token, 'cancel-5')).body.data;
    expect(pending.state).toBe('pending');
    const released = await h.call(acme.token, 'reservations/release', {
      tenantId: 'acme',
      reservationId: pending.id,
    });
    expect(released.body.data.state).toBe('cancelled');
    for (const b of blockers)
      await h.call(acme.token, 'reservations/release', { tenantId: 'acme', reservationId: b.id });
    expect(await quotaUsed()).toBe(0);
  });
});

describe('reservations.extend and renew', () => {
  it('extends all or nothing, answers availableUntil when another booking starts first, and refuses bad input', async () => {
    const r = (await create(acme.token, 'extend-1')).body.data;
    const by = await h.call(acme.token, 'reservations/extend', {
      tenantId: 'acme',
      reservationId: r.id,
      by: '1h',
      idempotencyKey: 'e1',
    });
    expect(by.body.data).toMatchObject({
      extended: true,
      reservation: { during: { start: r.during.start, end: r.during.end + hour } },
    });
    expect(h.lifecycle.signals).toContainEqual({
      reservationId: r.id,
      signal: { type: 'extended', end: r.during.end + hour },
    });
    const until = r.during.end + 2 * hour;
    const u = await h.call(acme.token, 'reservations/extend', {
      tenantId: 'acme',
      reservationId: r.id,
      until,
      idempotencyKey: 'e2',
    });
    expect(u.body.data.reservation.during.end).toBe(until);
    // An until already reached changes nothing, without a decision.
    const decisions = h.decisions.length;
    const noop = await h.call(acme.token, 'reservations/extend', {
      tenantId: 'acme',
      reservationId: r.id,
      until,
      idempotencyKey: 'e3',
    });
    expect(noop.body.data).toMatchObject({ extended: false, availableUntil: until });
    expect(h.decisions.length).toBe(decisions);

    // Someone else books the same GPUs from until + 1h: an extend past that point cannot happen.
    const nodeId = r.allocations[0].nodeId;
    await h.t.db.transaction().execute(async (trx) => {
      const start = new Date(until + hour);
      const allocationId = await insertBareAllocation(trx, {
        poolId,
        nodeId,
        start,
        end: new Date(until + 5 * hour),
        tenantId: 'acme',
      });
      await insertDeviceBookings(
        trx,
        r.allocations[0].deviceIds
          .slice(0, 1)
          .map((deviceId: string) => ({ deviceId, allocationId, start, end: new Date(until + 5 * hour) })),
      );
    });
    const blocked = await h.call(acme.token, 'reservations/extend', {
      tenantId: 'acme',
      reservationId: r.id,
      by: '3h',
      idempotencyKey: 'e4',
    });
    expect(blocked.body.data).toMatchObject({
      extended: false,
      availableUntil: until + hour,
      reservation: { during: { end: until } },
    });
    const { rows: ends } = await sql<{
      e: Date;
    }>`SELECT DISTINCT upper(b.during) AS e FROM device_bookings b JOIN allocations a ON a.id = b.allocation_id WHERE a.reservation_id = ${r.id}`.execute(
      h.t.db,
    );
    expect(ends.map((e) => e.e.getTime())).toEqual([until]);
    expect(await checkBookingInvariants(h.t.db)).toEqual({ deviceOverlaps: 0, scalarOverbookings: 0 });

    for (const [body, code] of [
      [{ tenantId: 'acme', reservationId: r.id, idempotencyKey: 'e5' }, 'INVALID_INPUT'],
      [{ tenantId: 'acme', reservationId: r.id, until, by: '1h', idempotencyKey: 'e6' }, 'INVALID_INPUT'],
      [{ tenantId: 'acme', reservationId: r.id, by: 'soon', idempotencyKey: 'e7' }, 'INVALID_INPUT'],
    ] as const) {
      const res = await h.call(acme.token, 'reservations/extend', body);
      expect(res.body.error.code).toBe(code);
    }
    // One extend in flight at a time.
    await sql`INSERT INTO extend_holds (reservation_id, hold) VALUES (${r.id}, 'hold_other')`.execute(h.t.db);
    const busy = await h.call(acme.token, 'reservations/extend', {
      tenantId: 'acme',
      reservationId: r.id,
      by: '10m',
      idempotencyKey: 'e8',
    });
    expect(busy.body.error).toMatchObject({
      code: 'CONFLICT',
      details: { reason: 'extend-in-flight', retryAfterSeconds: 60 },
    });
    await sql`DELETE FROM extend_holds WHERE reservation_id = ${r.id}`.execute(h.t.db);
    await h.call(acme.token, 'reservations/release', { tenantId: 'acme', reservationId: r.id });
    const ended = await h.call(acme.token, 'reservations/extend', {
      tenantId: 'acme',
      reservationId: r.id,
      by: '1h',
      idempotencyKey: 'e9',
    });
    expect(ended.body.error.code).toBe('INVALID_STATE');
  });

  it('renews only reservations made with leaseSeconds', async () => {
    const plain = (await create(acme.token, 'renew-1', { devices: [{ class: 'gpu', count: 1 }] })).body.data;
    const refused = await h.call(acme.token, 'reservations/renew', {
      tenantId: 'acme',
      reservationId: plain.id,
    });
    expect(refused).toMatchObject({ status: 409, body: { error: { code: 'INVALID_STATE' } } });
    const leased = (
      await create(acme.token, 'renew-2', { devices: [{ class: 'gpu', count: 1 }], leaseSeconds: 600 })
    ).body.data;
    expect(leased.lease).toMatchObject({ seconds: 600 });
    await advanceComputeClock(h.t.db, 5 * 60_000);
    const renewed = await h.call(acme.token, 'reservations/renew', {
      tenantId: 'acme',
      reservationId: leased.id,
    });
    expect(renewed.body.data.lease.expiresAt - leased.lease.expiresAt).toBeGreaterThanOrEqual(
      5 * 60_000 - 1_000,
    );
    expect(renewed.body.data.during).toEqual(leased.during);
    for (const r of [plain, leased])
      await h.call(acme.token, 'reservations/release', { tenantId: 'acme', reservationId: r.id });
  });
});

describe('reservations.extend: the decision before the slot, and the key', () => {
  const extend = (token: string, reservationId: string, key: string, change: Record<string, unknown>) =>
    h.call(token, 'reservations/extend', { tenantId: 'acme', reservationId, idempotencyKey: key, ...change });

  it('refuses a caller without extend permission before it takes the slot, so the owner can still extend', async () => {
    const viewer = await tenantWithMember(h, 'acme', { name: 'acme-viewer', role: 'viewer' });
    const r = (await create(acme.token, 'slot-1', { devices: [{ class: 'gpu', count: 1 }] })).body.data;
    // Another extend holds the slot: the viewer is refused by IAM, not by the slot it never reaches.
    await sql`INSERT INTO extend_holds (reservation_id, hold) VALUES (${r.id}, 'hold_other')`.execute(h.t.db);
    const refused = await extend(viewer.token, r.id, 'v1', { by: '1h' });
    expect(refused.body.error).toMatchObject({ code: 'ACCESS_DENIED' });
    expect(refused.body.error.message).toContain('compute:reservations:extend on compute-reservation');
    await sql`DELETE FROM extend_holds WHERE reservation_id = ${r.id}`.execute(h.t.db);
    // A refused caller retrying as fast as it can leaves nothing behind the owner trips over.
    const storm = await Promise.all(
      Array.from({ length: 8 }, (_, i) => extend(viewer.token, r.id, `v-${i}`, { by: '1h' })),
    );
    expect(new Set(storm.map((s) => s.body.error?.code))).toEqual(new Set(['ACCESS_DENIED']));
    const { rows: holds } = await sql`SELECT 1 FROM extend_holds WHERE reservation_id = ${r.id}`.execute(
      h.t.db,
    );
    expect(holds).toHaveLength(0);
    const owner = await extend(acme.token, r.id, 'o1', { by: '1h' });
    expect(owner.body.data).toMatchObject({
      extended: true,
      reservation: { during: { end: r.during.end + hour } },
    });
    await h.call(acme.token, 'reservations/release', { tenantId: 'acme', reservationId: r.id });
  });

  it('answers a retried key with its first extend, never extending twice', async () => {
    const r = (await create(acme.token, 'retry-1', { devices: [{ class: 'gpu', count: 1 }] })).body.data;
    const first = await extend(acme.token, r.id, 'once', { by: '1h' });
    expect(first.body.data).toMatchObject({
      extended: true,
      reservation: { during: { end: r.during.end + hour } },
    });
    const decisions = h.decisions.length;
    const signals = h.lifecycle.signals.length;
    const retries = await Promise.all([1, 2, 3].map(() => extend(acme.token, r.id, 'once', { by: '1h' })));
    for (const retry of retries) {
      expect(retry.body.data).toMatchObject({
        extended: true,
        reservation: { during: { end: r.during.end + hour } },
      });
    }
    expect(h.decisions.length).toBe(decisions);
    expect(h.lifecycle.signals.length).toBe(signals);
    // The same key for another change is a conflict; another identity's same key is its own.
    const other = await extend(acme.token, r.id, 'once', { by: '2h' });
    expect(other.body.error).toMatchObject({ code: 'CONFLICT', details: { reservationId: r.id } });
    expect(other.body.error.message).toContain("idempotencyKey: 'once'");
    const second = await extend(acme2.token, r.id, 'once', { by: '1h' });
    expect(second.body.data.reservation.during.end).toBe(r.during.end + 2 * hour);
    const { rows } = await sql<{ key: string; previous: Date; end: Date }>`
      SELECT idempotency_key AS key, previous_end AS previous, new_end AS end FROM reservation_extends
      WHERE reservation_id = ${r.id} ORDER BY created_at, new_end`.execute(h.t.db);
    expect(rows.map((x) => [x.key, x.previous.getTime(), x.end.getTime()])).toEqual([
      ['once', r.during.end, r.during.end + hour],
      ['once', r.during.end + hour, r.during.end + 2 * hour],
    ]);
    const { rows: audit } = await sql`SELECT 1 FROM audit_events
      WHERE resource_id = ${r.id} AND action = 'compute:reservations:extend'`.execute(h.t.db);
    expect(audit).toHaveLength(2);
    await h.call(acme.token, 'reservations/release', { tenantId: 'acme', reservationId: r.id });
  });
});

describe('capacity', () => {
  it('previews exactly what a create would do, and counts allocatable, allocated, reserved and available', async () => {
    const request = { tenantId: 'acme', poolId, devices: [{ class: 'gpu', count: 8 }], duration: '2h' };
    const fits = await h.call(acme.token, 'capacity/preview', request);
    expect(fits.body.data).toMatchObject({
      fits: true,
      hostShare: { vcpu: 192, memoryGiB: 2048 },
      quota: [{ resource: 'gpu', needed: 8, limit: 64 }],
    });
    const baseline = (await h.call(acme.token, 'capacity/get', { tenantId: 'acme', poolId })).body.data
      .pools[0];
    const first = (await create(acme.token, 'cap-1')).body.data;
    const { rows } = await sql<{ now: Date }>`SELECT compute_now() AS now`.execute(h.t.db);
    const later = (
      await create(acme.token, 'cap-2', {
        devices: [{ class: 'gpu', count: 4 }],
        start: rows[0]!.now.getTime() + 5 * hour,
      })
    ).body.data;
    const capacity = await h.call(acme.token, 'capacity/get', { tenantId: 'acme', poolId });
    expect(capacity.body.data.pools).toEqual([
      expect.objectContaining({
        poolId,
        nodes: 2,
        allocatable: 16,
        allocated: 8,
        reserved: baseline.reserved + 4,
        available: 8,
        quota: { limit: 64, used: 12 },
      }),
    ]);
    const second = (await create(acme.token, 'cap-3')).body.data;
    expect(second.state).toBe('placed');
    const full = await h.call(acme.token, 'capacity/preview', request);
    expect(full.body.data.fits).toBe(false);
    expect(full.body.data.message).toContain('0 of 2 nodes fit: 2 lack 8 free GPUs');
    expect(full.body.data.earliestStart).toBe(first.during.end);
    const pending = (await create(acme.token, 'cap-4')).body.data;
    expect(pending.state).toBe('pending');
    expect(pending.conditions[0].earliestStart).toBe(full.body.data.earliestStart);
    for (const r of [first, later, second, pending])
      await h.call(acme.token, 'reservations/release', { tenantId: 'acme', reservationId: r.id });
  });
});
