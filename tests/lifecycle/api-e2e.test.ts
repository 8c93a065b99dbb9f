import { sql } from 'kysely';
import { describe, expect, it } from 'vitest';
import { releaseReservation } from '../../db/reservations/reservations.ts';
import { snapshotQuery } from '../../workflows/reservation/messages.ts';
import { callApi } from '../support/api.ts';
import { useLifecycleApi, wakeReasons } from './harness.ts';

/**
 * The reservations API (admission) and the lifecycle workflows together: admission starts the
 * workflow after its commit, and a release through the API wakes the pool's pending reservations.
 */
const h = useLifecycleApi({
  name: 'api-e2e',
  nodes: 1,
  // A pending retry far away: a pending reservation placed within seconds was woken by the release.
  timers: { pendingRetryMs: 120_000 },
  pool: { ownerTenantId: 'platform', gpuQuota: 16 },
});

async function call(path: string, body: unknown) {
  const { status, body: answer } = await callApi(h.compute.app, h.credential.token, path, body);
  return { status, body: answer as { data: { id: string; state: string }; error?: { code: string } } };
}

async function stateOf(id: string): Promise<string> {
  return (await call('reservations/get', { tenantId: 'acme', reservationId: id })).body.data.state;
}

describe('admission and lifecycle together', () => {
  it('binds what admission placed, and places a pending reservation as soon as a release frees capacity', async () => {
    const first = await call('reservations/create', {
      tenantId: 'acme',
      poolId: h.poolId,
      devices: [{ class: 'gpu', count: 2 }],
      duration: '1h',
      idempotencyKey: 'e2e-first',
    });
    expect(first.body.data.state).toBe('placed');
    const firstId = first.body.data.id as string;
    await expect.poll(() => stateOf(firstId), { timeout: 30_000 }).toBe('binding');

    const second = await call('reservations/create', {
      tenantId: 'acme',
      poolId: h.poolId,
      devices: [{ class: 'gpu', count: 2 }],
      duration: '1h',
      idempotencyKey: 'e2e-second',
    });
    expect(second.body.data.state).toBe('pending');
    const secondId = second.body.data.id as string;

    // The node reports the first bound (what the gateway writes, then its wake-up).
    const allocation = await h.db
      .selectFrom('allocations')
      .where('reservation_id', '=', firstId)
      .select('id')
      .executeTakeFirstOrThrow();
    await sql`UPDATE allocations SET state = 'bound', bound_at = compute_now(),
      binding = ${JSON.stringify({ cdiDevices: ['bcd.dev/gpu=GPU-0'], envFile: '/run/bcd/allocations/a.env' })}::jsonb
      WHERE id = ${allocation.id}`.execute(h.db);
    await h.temporal.client.workflow
      .getHandle(firstId)
      .signal('allocationReport', { allocationId: allocation.id, kind: 'bound' });
    await expect.poll(() => stateOf(firstId), { timeout: 30_000 }).toBe('active');

    const released = await call('reservations/release', { tenantId: 'acme', reservationId: firstId });
    expect(released.body.data.state).toBe('released');
    await expect.poll(() => stateOf(secondId), { timeout: 30_000 }).toMatch(/^(placed|binding)$/);
    const placedOn = await h.db
      .selectFrom('allocations')
      .where('reservation_id', '=', secondId)
      .where('superseded_at', 'is', null)
      .select('node_id')
      .executeTakeFirstOrThrow();
    expect(placedOn.node_id).toBe(h.nodes[0]!.id);

    // The first one's usage reached the billing ledger once, and its workflow ended.
    expect(await h.temporal.client.workflow.getHandle(firstId).result()).toEqual({ state: 'released' });
    const ledger = await sql<{
      n: number;
    }>`SELECT count(*)::int AS n FROM iam.usage_records WHERE subject LIKE ${`reservation/${firstId}/%`}`.execute(
      h.db,
    );
    expect(ledger.rows[0]!.n).toBe(1);

    const cancelled = await call('reservations/release', { tenantId: 'acme', reservationId: secondId });
    expect(cancelled.body.data.state).toBe('released');
  });

  it('renews through the workflow and moves its end timer when an extend commits', async () => {
    const created = await call('reservations/create', {
      tenantId: 'acme',
      poolId: h.poolId,
      devices: [{ class: 'gpu', count: 2 }],
      duration: '10m',
      leaseSeconds: 120,
      idempotencyKey: 'e2e-extend',
    });
    const id = created.body.data.id;
    const handle = h.temporal.client.workflow.getHandle(id);
    await expect
      .poll(async () => (await handle.query(snapshotQuery))?.state, { timeout: 30_000 })
      .toBe('binding');
    const before = (await handle.query(snapshotQuery))!;

    const renewed = await call('reservations/renew', { tenantId: 'acme', reservationId: id });
    expect(renewed.status).toBe(200);
    const leaseRow = await h.db
      .selectFrom('reservations')
      .where('id', '=', id)
      .select('lease_expires_at')
      .executeTakeFirstOrThrow();
    expect(leaseRow.lease_expires_at!.getTime()).toBeGreaterThanOrEqual(before.leaseExpiresAt!);

    const extended = await call('reservations/extend', {
      tenantId: 'acme',
      reservationId: id,
      by: '5m',
      idempotencyKey: 'e2e-extend-1',
    });
    expect(extended.status).toBe(200);
    await expect
      .poll(async () => (await handle.query(snapshotQuery))?.end, { timeout: 20_000 })
      .toBe(before.end! + 300_000);
    // The node's assignment follows the new end (a new NodeSpec generation).
    await expect
      .poll(
        async () => {
          const spec = (
            await h.db
              .selectFrom('nodes')
              .select('spec')
              .where('id', '=', h.nodes[0]!.id)
              .executeTakeFirstOrThrow()
          ).spec as { devices?: Array<{ until: number }> };
          return spec.devices?.[0]?.until;
        },
        { timeout: 20_000 },
      )
      .toBe(before.end! + 300_000);
    await call('reservations/release', { tenantId: 'acme', reservationId: id });
    expect(await handle.result()).toEqual({ state: 'released' });
  });

  it('a repeated release wakes a lifecycle whose first release committed but never woke it', async () => {
    const created = await call('reservations/create', {
      tenantId: 'acme',
      poolId: h.poolId,
      devices: [{ class: 'gpu', count: 1 }],
      duration: '10m',
      // wall time: an hour ahead, so the lifecycle sleeps on its start timer and nothing wakes it soon
      start: Date.now() + 3_600_000,
      idempotencyKey: 'e2e-repeated-release',
    });
    const id = created.body.data.id;
    const handle = h.temporal.client.workflow.getHandle(id);
    await expect
      .poll(async () => (await handle.query(snapshotQuery))?.state, { timeout: 30_000 })
      .toBe('placed');
    // The first release's transaction, as an API process that died right after its commit left it.
    await h.db.transaction().execute((trx) => releaseReservation(trx, id, 'release'));
    expect((await handle.describe()).status.name).toBe('RUNNING');
    const again = await call('reservations/release', { tenantId: 'acme', reservationId: id });
    expect(again.body.data.state).toBe('released');
    expect(await handle.result()).toEqual({ state: 'released' });
    // Woken by the repeat, not by a timer of its own.
    const wakes = await wakeReasons(h, id);
    expect(wakes).toContainEqual(expect.stringContaining('release repeated'));
    // Once the lifecycle has finished, a repeat answers the same and wakes nothing.
    expect((await call('reservations/release', { tenantId: 'acme', reservationId: id })).status).toBe(200);
  });
});
