import { sql } from 'kysely';
import { beforeAll, describe, expect, it } from 'vitest';
import { checkBookingInvariants } from '../../db/allocations/invariants.ts';
import { h100Pool, type TenantFixture, tenantWithMember } from './fixtures.ts';
import { useAdmissionHarness } from './harness.ts';

const h = useAdmissionHarness({ max: 20 });
let tenants: TenantFixture[];
let poolId: string;

beforeAll(async () => {
  tenants = [];
  for (const id of ['acme', 'globex', 'initech', 'umbrella']) tenants.push(await tenantWithMember(h, id));
  // 25 nodes of 8 GPUs: room for exactly 100 two-GPU reservations.
  poolId = (await h100Pool(h, { nodes: 25, tenants: tenants.map((t) => t.id), gpuQuota: 100 })).poolId;
});

describe('the admission storm', () => {
  it('places exactly 100 of 200 concurrent creates from four tenants, double-books nothing and charges quota once', async () => {
    const requests = Array.from({ length: 200 }, (_, i) => {
      const tenant = tenants[i % tenants.length]!;
      return {
        token: tenant.token,
        body: {
          tenantId: tenant.id,
          poolId,
          devices: [{ class: 'gpu', count: 2 }],
          duration: '4h',
          idempotencyKey: `storm-${i}`,
        },
      };
    });
    const fire = () => Promise.all(requests.map((r) => h.call(r.token, 'reservations/create', r.body)));
    const started = Date.now();
    const answers = await fire();
    const elapsed = Date.now() - started;
    expect(answers.filter((a) => a.status !== 200).map((a) => a.body.error)).toEqual([]);
    const states = answers.map((a) => a.body.data.state);
    expect(states.filter((s) => s === 'placed')).toHaveLength(100);
    expect(states.filter((s) => s === 'pending')).toHaveLength(100);
    for (const a of answers.filter((x) => x.body.data.state === 'pending')) {
      expect(a.body.data.conditions[0]).toMatchObject({ type: 'Unschedulable', reason: 'NoFit' });
    }

    expect(await checkBookingInvariants(h.t.db)).toEqual({ deviceOverlaps: 0, scalarOverbookings: 0 });
    const { rows: bookings } = await sql<{ n: string; devices: string }>`
      SELECT count(*) AS n, count(DISTINCT device_id) AS devices FROM device_bookings`.execute(h.t.db);
    expect(bookings[0]).toEqual({ n: '200', devices: '200' });

    // The same 200 calls again: the stored reservations, nothing charged or booked twice.
    const again = await fire();
    expect(again.map((a) => a.body.data.id)).toEqual(answers.map((a) => a.body.data.id));
    const { rows: charges } = await sql<{ reservations: string; charges: string; total: string }>`
      SELECT count(DISTINCT reservation_id) AS reservations, count(*) AS charges, sum(amount) AS total
      FROM quota_charges WHERE refunded_at IS NULL`.execute(h.t.db);
    expect(charges[0]).toEqual({ reservations: '200', charges: '200', total: '400' });
    const { rows: used } = await sql<{ tenant_id: string; used: string }>`
      SELECT tenant_id, used FROM quotas WHERE pool_id = ${poolId} ORDER BY tenant_id`.execute(h.t.db);
    expect(used.map((u) => Number(u.used))).toEqual([100, 100, 100, 100]);
    const { rows: allocations } = await sql<{ n: string }>`SELECT count(*) AS n FROM allocations`.execute(
      h.t.db,
    );
    expect(Number(allocations[0]!.n)).toBe(100);
    console.log(
      JSON.stringify({
        storm: { creates: 200, elapsedMs: elapsed, perSecond: Math.round(200_000 / elapsed) },
      }),
    );
  });
});
