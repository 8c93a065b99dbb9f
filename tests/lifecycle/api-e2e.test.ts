import { randomBytes } from 'node:crypto';
import { sql } from 'kysely';
import { afterAll, beforeAll, describe, expect, inject, it } from 'vitest';
import { parseConfig } from '../../core/config.ts';
import { createLogger } from '../../core/logger.ts';
import {
  insertPool,
  insertSite,
  offerPool,
  type RegisteredNode,
  registerReadyNodes,
} from '../../db/nodes/fleet.ts';
import { bootstrapPlatform } from '../../iam/bootstrap.ts';
import { createEmbeddedIam } from '../../iam/embedded/index.ts';
import { createCompute } from '../../server/compute.ts';
import { connectTemporal, type TemporalClientHandle } from '../../temporal/client.ts';
import { createTemporalLifecycle } from '../../temporal/lifecycle.ts';
import { type RunningWorker, startWorker } from '../../temporal/worker.ts';
import { snapshotQuery } from '../../workflows/reservation/messages.ts';
import { createTestDatabase, type TestDatabase } from '../support/database.ts';
import { fastTimers, smallShape } from './harness.ts';

/**
 * The reservations API (admission) and the lifecycle workflows together: admission starts the
 * workflow after its commit, and a release through the API wakes the pool's pending reservations.
 */
let t: TestDatabase;
let temporal: TemporalClientHandle;
let worker: RunningWorker;
let compute: ReturnType<typeof createCompute>;
let token: string;
let poolId: string;
let node: RegisteredNode;

beforeAll(async () => {
  t = await createTestDatabase();
  const log = createLogger({ level: 'warn', name: 'api-e2e' });
  const iam = createEmbeddedIam({ db: t.db, log });
  await bootstrapPlatform(iam);
  await iam.admin.createTenant({ id: 'acme', name: 'acme' });
  const identity = await iam.admin.createIdentity({ tenantId: 'acme', kind: 'person', name: 'ada' });
  await iam.admin.bindRole({ identityId: identity.id, role: 'member' });
  token = (await iam.admin.createToken({ identityId: identity.id })).token;
  const siteId = await insertSite(t.db, { name: 'site-e2e', region: 'eu-central-1' });
  poolId = await insertPool(t.db, { siteId, ownerTenantId: 'platform', name: 'h100', gpuModel: 'h100' });
  [node] = (await registerReadyNodes(t.db, { siteId, poolId, count: 1, shape: smallShape })) as [
    RegisteredNode,
  ];
  await offerPool(t.db, { poolId, tenantId: 'acme', quota: { gpu: 16 } });

  const address = inject('temporalAddress');
  const taskQueue = `lifecycle-api-e2e-${randomBytes(4).toString('hex')}`;
  // A pending retry far away: a pending reservation placed within seconds was woken by the release.
  const timers = { ...fastTimers, pendingRetryMs: 120_000 };
  temporal = await connectTemporal({ address });
  worker = await startWorker({ db: t.db, log, iam, address, taskQueue, timers, sweeper: false });
  const lifecycle = createTemporalLifecycle(temporal.client, { taskQueue, timers });
  compute = createCompute({
    config: parseConfig({}),
    db: t.db,
    log,
    iam,
    lifecycle,
    temporal: temporal.client,
  });
});

afterAll(async () => {
  await worker?.stop();
  await temporal?.close();
  await t?.drop();
});

async function call(path: string, body: unknown) {
  const response = await compute.app.request(`/api/compute/${path}`, {
    method: 'POST',
    headers: {
      'content-type': 'application/json',
      'x-better-compute': '1',
      authorization: `Bearer ${token}`,
    },
    body: JSON.stringify(body),
  });
  return {
    status: response.status,
    body: (await response.json()) as {
      data: { id: string; state: string };
      error?: { code: string };
    },
  };
}

async function stateOf(id: string): Promise<string> {
  return (await call('reservations/get', { tenantId: 'acme', reservationId: id })).body.data.state;
}

describe('admission and lifecycle together', () => {
  it('binds what admission placed, and places a pending reservation as soon as a release frees capacity', async () => {
    const first = await call('reservations/create', {
      tenantId: 'acme',
      poolId,
      devices: [{ class: 'gpu', count: 2 }],
      duration: '1h',
      idempotencyKey: 'e2e-first',
    });
    expect(first.body.data.state).toBe('placed');
    const firstId = first.body.data.id as string;
    await expect.poll(() => stateOf(firstId), { timeout: 10_000 }).toBe('binding');

    const second = await call('reservations/create', {
      tenantId: 'acme',
      poolId,
      devices: [{ class: 'gpu', count: 2 }],
      duration: '1h',
      idempotencyKey: 'e2e-second',
    });
    expect(second.body.data.state).toBe('pending');
    const secondId = second.body.data.id as string;

    // The node reports the first bound (what the gateway writes, then its wake-up).
    const allocation = await t.db
      .selectFrom('allocations')
      .where('reservation_id', '=', firstId)
      .select('id')
      .executeTakeFirstOrThrow();
    await sql`UPDATE allocations SET state = 'bound', bound_at = compute_now(),
      binding = ${JSON.stringify({ cdiDevices: ['bcd.dev/gpu=GPU-0'], envFile: '/run/bcd/allocations/a.env' })}::jsonb
      WHERE id = ${allocation.id}`.execute(t.db);
    await temporal.client.workflow
      .getHandle(firstId)
      .signal('allocationReport', { allocationId: allocation.id, kind: 'bound' });
    await expect.poll(() => stateOf(firstId), { timeout: 10_000 }).toBe('active');

    const released = await call('reservations/release', { tenantId: 'acme', reservationId: firstId });
    expect(released.body.data.state).toBe('released');
    await expect.poll(() => stateOf(secondId), { timeout: 10_000 }).toMatch(/^(placed|binding)$/);
    const placedOn = await t.db
      .selectFrom('allocations')
      .where('reservation_id', '=', secondId)
      .where('superseded_at', 'is', null)
      .select('node_id')
      .executeTakeFirstOrThrow();
    expect(placedOn.node_id).toBe(node.id);

    // The first one's usage reached the billing ledger once, and its workflow ended.
    expect(await temporal.client.workflow.getHandle(firstId).result()).toEqual({ state: 'released' });
    const ledger = await sql<{
      n: number;
    }>`SELECT count(*)::int AS n FROM iam.usage_records WHERE subject LIKE ${`reservation/${firstId}/%`}`.execute(
      t.db,
    );
    expect(ledger.rows[0]!.n).toBe(1);

    const cancelled = await call('reservations/release', { tenantId: 'acme', reservationId: secondId });
    expect(cancelled.body.data.state).toBe('released');
  });

  it('renews through the workflow and moves its end timer when an extend commits', async () => {
    const created = await call('reservations/create', {
      tenantId: 'acme',
      poolId,
      devices: [{ class: 'gpu', count: 2 }],
      duration: '10m',
      leaseSeconds: 120,
      idempotencyKey: 'e2e-extend',
    });
    const id = created.body.data.id;
    const handle = temporal.client.workflow.getHandle(id);
    await expect
      .poll(async () => (await handle.query(snapshotQuery))?.state, { timeout: 10_000 })
      .toBe('binding');
    const before = (await handle.query(snapshotQuery))!;

    const renewed = await call('reservations/renew', { tenantId: 'acme', reservationId: id });
    expect(renewed.status).toBe(200);
    const leaseRow = await t.db
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
      .poll(async () => (await handle.query(snapshotQuery))?.end, { timeout: 5_000 })
      .toBe(before.end! + 300_000);
    // The node's assignment follows the new end (a new NodeSpec generation).
    await expect
      .poll(
        async () => {
          const spec = (
            await t.db.selectFrom('nodes').select('spec').where('id', '=', node.id).executeTakeFirstOrThrow()
          ).spec as { devices?: Array<{ until: number }> };
          return spec.devices?.[0]?.until;
        },
        { timeout: 5_000 },
      )
      .toBe(before.end! + 300_000);
    await call('reservations/release', { tenantId: 'acme', reservationId: id });
    expect(await handle.result()).toEqual({ state: 'released' });
  });
});
