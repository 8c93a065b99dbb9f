import { describe, expect, it } from 'vitest';
import { readComputeNow } from '../../db/clock.ts';
import { useLifecycleApi } from '../lifecycle/harness.ts';
import { callApi } from '../support/api.ts';
import { seedPool, smallShape } from '../support/fleet.ts';

/** How far ahead a calendar reservation may start: the pool's policy calendar.horizonDays (90 by default). */
const h = useLifecycleApi({ name: 'calendar-horizon', nodes: 1, pool: { ownerTenantId: 'platform' } });

const day = 86_400_000;

async function create(poolId: string, start: number, key: string) {
  return callApi(h.compute.app, h.credential.token, 'reservations/create', {
    tenantId: 'acme',
    poolId,
    devices: [{ class: 'gpu', count: 1 }],
    duration: '1h',
    start,
    idempotencyKey: key,
  }) as Promise<{
    status: number;
    body: { data?: { state: string; during: { start: number } }; error?: { code: string; message: string } };
  }>;
}

describe('the calendar horizon', () => {
  it('refuses a start beyond the pool horizon with INVALID_INPUT naming the limit, and books one within it', async () => {
    const now = (await readComputeNow(h.db)).getTime();
    const far = await create(h.poolId, now + 100 * day, 'too-far');
    expect(far.status).toBe(400);
    expect(far.body.error?.code).toBe('INVALID_INPUT');
    expect(far.body.error?.message).toMatch(/start: .* at most 90 days from now .*calendar\.horizonDays/);
    const farther = await create(h.poolId, now + 5_000 * day, 'much-too-far');
    expect(farther.body.error?.code).toBe('INVALID_INPUT');
    // Nothing was written for the refusals.
    const rows = await h.db
      .selectFrom('reservations')
      .where('idempotency_key', 'in', ['too-far', 'much-too-far'])
      .select('id')
      .execute();
    expect(rows).toEqual([]);

    const within = await create(h.poolId, now + 80 * day, 'within');
    expect(within.status).toBe(200);
    expect(within.body.data?.state).toBe('placed');
    expect(within.body.data?.during.start).toBe(now + 80 * day);

    // The preview holds a start to the same horizon.
    const preview = await callApi(h.compute.app, h.credential.token, 'capacity/preview', {
      tenantId: 'acme',
      poolId: h.poolId,
      devices: [{ class: 'gpu', count: 1 }],
      duration: '1h',
      start: now + 100 * day,
    });
    expect((preview.body as { error?: { code: string } }).error?.code).toBe('INVALID_INPUT');
  });

  it('follows the pool policy calendar.horizonDays', async () => {
    const { poolId } = await seedPool(h.db, {
      siteId: h.siteId,
      name: 'long-horizon',
      ownerTenantId: 'platform',
      policy: { calendar: { horizonDays: 200 } },
      nodes: 1,
      namePrefix: 'long',
      shape: smallShape,
      offers: { acme: { gpu: 8 } },
    });
    const now = (await readComputeNow(h.db)).getTime();
    const ok = await create(poolId, now + 150 * day, 'long-ok');
    expect(ok.status).toBe(200);
    expect(ok.body.data?.state).toBe('placed');
    const refused = await create(poolId, now + 250 * day, 'long-refused');
    expect(refused.body.error?.code).toBe('INVALID_INPUT');
    expect(refused.body.error?.message).toMatch(/at most 200 days/);
  });
});
