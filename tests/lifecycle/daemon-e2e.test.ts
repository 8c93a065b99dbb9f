import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { SimulatedFleet } from '../../daemon/sim.ts';
import type { StartedGateway } from '../../gateway/server.ts';
import { eventually } from '../support/eventually.ts';
import { joinSimulatedFleet, startTestGateway } from '../support/gateway.ts';
import { useTempDir } from '../support/temp-dir.ts';
import { useLifecycleApi } from './harness.ts';

/**
 * The whole path with real parts: the reservations API, the lifecycle on Temporal, the gateway with
 * mutual TLS, and a simulated bcd that joins, receives its NodeSpec, binds and signs its reports.
 */
const h = useLifecycleApi({
  name: 'daemon-e2e',
  nodes: 0,
  timers: { bindTimeoutMs: 30_000 },
  pool: { ownerTenantId: 'platform', gpuQuota: 16 },
});
const dir = useTempDir('bc-lifecycle-');
let gateway: StartedGateway;
let fleet: SimulatedFleet;

beforeAll(async () => {
  gateway = await startTestGateway({ db: h.db, log: h.log, lifecycle: h.lifecycle });
  fleet = await joinSimulatedFleet(gateway, h.db, h.poolId, { nodes: 1, rootDir: dir, log: h.log });
  await eventually(() =>
    h.db
      .selectFrom('nodes as n')
      .where('n.provision_state', '=', 'ready')
      .where((eb) => eb.exists(eb.selectFrom('devices as d').whereRef('d.node_id', '=', 'n.id')))
      .select('n.id')
      .executeTakeFirst(),
  );
});

afterAll(async () => {
  await fleet?.stop();
  await gateway?.stop();
});

const get = (id: string) =>
  h.compute.api.reservations.get(h.credential, { tenantId: 'acme', reservationId: id });

describe('a reservation on a simulated bcd', () => {
  it('is placed, bound by the node (signed report), active with its binding, and released', async () => {
    const created = await h.compute.api.reservations.create(h.credential, {
      tenantId: 'acme',
      poolId: h.poolId,
      devices: [{ class: 'gpu', count: 2 }],
      duration: '1h',
      idempotencyKey: 'daemon-e2e',
    });
    expect(created.state).toBe('placed');
    await expect
      .poll(async () => (await get(created.id)).state, { timeout: 20_000, interval: 200 })
      .toBe('active');
    const active = await get(created.id);
    expect(JSON.stringify(active)).toContain('bcd.dev/gpu=');
    const allocation = await h.db
      .selectFrom('allocations')
      .where('reservation_id', '=', created.id)
      .select(['attested', 'bound_at'])
      .executeTakeFirstOrThrow();
    expect(allocation.attested).toBe(true);

    const released = await h.compute.api.reservations.release(h.credential, {
      tenantId: 'acme',
      reservationId: created.id,
    });
    expect(released.state).toBe('released');
    // The node's spec loses the assignment.
    await expect
      .poll(
        async () => {
          const node = await h.db.selectFrom('nodes').select('spec').executeTakeFirstOrThrow();
          return ((node.spec as { devices?: unknown[] }).devices ?? []).length;
        },
        { timeout: 30_000 },
      )
      .toBe(0);
    expect(await h.temporal.client.workflow.getHandle(created.id).result()).toEqual({ state: 'released' });
  });
});
