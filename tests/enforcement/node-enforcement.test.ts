import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { SimulatedFleet } from '../../daemon/sim.ts';
import { insertPool, offerPool } from '../../db/nodes/fleet.ts';
import type { StartedGateway } from '../../gateway/server.ts';
import { useLifecycleApi } from '../lifecycle/harness.ts';
import { eventually } from '../support/eventually.ts';
import { joinSimulatedFleet, startTestGateway } from '../support/gateway.ts';
import { tenantMember } from '../support/iam.ts';
import { useTempDir } from '../support/temp-dir.ts';

/**
 * What a reservation books is what the node enforces, through the real parts: the API, the
 * lifecycle on Temporal, the gateway with mutual TLS, and simulated bcd agents that make real
 * slices (in a sub-tree of this machine's cgroupfs when run as root, else in a cgroupfs-shaped
 * directory), refuse bindings they cannot honour, and converge MIG layouts.
 */
const h = useLifecycleApi({ name: 'node-enforcement', nodes: 0, timers: { bindTimeoutMs: 30_000 } });
const dir = useTempDir('bc-enforce-');
let gateway: StartedGateway;
let hostFleet: SimulatedFleet;
let migFleet: SimulatedFleet;
let hostPool: string;
let migPool: string;

beforeAll(async () => {
  gateway = await startTestGateway({ db: h.db, log: h.log, lifecycle: h.lifecycle });
  hostPool = await insertPool(h.db, {
    siteId: h.siteId,
    ownerTenantId: 'platform',
    name: 'h100-host',
    gpuModel: 'h100',
    policy: { perGpu: { vcpu: 0, memoryGiB: 0 } },
  });
  await offerPool(h.db, { poolId: hostPool, tenantId: 'acme', quota: { gpu: 16, vcpu: 64, memoryGiB: 512 } });
  migPool = await insertPool(h.db, {
    siteId: h.siteId,
    ownerTenantId: 'platform',
    name: 'h100-mig',
    gpuModel: 'h100',
    sharingMode: 'mig',
    policy: { perGpu: { vcpu: 0, memoryGiB: 0 } },
  });
  await offerPool(h.db, { poolId: migPool, tenantId: 'acme', quota: { 'gpu.mig': 14 } });
  hostFleet = await joinSimulatedFleet(gateway, h.db, hostPool, {
    nodes: 1,
    rootDir: `${dir}/host`,
    log: h.log,
    shape: { gpus: 4, vcpu: 64, memoryGiB: 256 },
  });
  migFleet = await joinSimulatedFleet(gateway, h.db, migPool, {
    nodes: 1,
    rootDir: `${dir}/mig`,
    log: h.log,
    namePrefix: 'mig',
    shape: { gpus: 2, migProfiles: Array(7).fill('1g.10gb') },
  });
  await eventually(async () => {
    const rows = await h.db
      .selectFrom('nodes as n')
      .where('n.provision_state', '=', 'ready')
      .where('n.observed_generation', '>=', '1')
      .where((eb) => eb.exists(eb.selectFrom('devices as d').whereRef('d.node_id', '=', 'n.id')))
      .select('n.id')
      .execute();
    return rows.length === 2;
  });
});

afterAll(async () => {
  await hostFleet?.stop();
  await migFleet?.stop();
  await gateway?.stop();
});

const get = (id: string) =>
  h.compute.api.reservations.get(h.credential, { tenantId: 'acme', reservationId: id });
const stateOf = async (id: string) => (await get(id)).state;
const events = async (id: string) =>
  (
    await h.db
      .selectFrom('outbox_events')
      .where('subject', '=', `reservation/${id}`)
      .select(['type', 'data'])
      .orderBy('id')
      .execute()
  ).map((e) => ({ type: e.type, data: e.data as Record<string, unknown> }));

describe('host resources, enforced', { timeout: 300_000 }, () => {
  it('--cpus 4 --memory 8 becomes active with its slice holding exactly those limits; release removes it', async () => {
    const created = await h.compute.api.reservations.create(h.credential, {
      tenantId: 'acme',
      poolId: hostPool,
      devices: [{ class: 'gpu', count: 1 }],
      resources: { vcpu: 4, memoryGiB: 8 },
      duration: '1h',
      idempotencyKey: 'enforce-slice',
    });
    await expect.poll(() => stateOf(created.id), { timeout: 90_000, interval: 200 }).toBe('active');
    const allocation = await h.db
      .selectFrom('allocations')
      .where('reservation_id', '=', created.id)
      .select(['id', 'binding'])
      .executeTakeFirstOrThrow();
    const slice = `bcd-alloc-${allocation.id}.slice`;
    const view = await get(created.id);
    expect(JSON.stringify(view)).toContain(`"cgroupParent":"${slice}"`);
    // The NodeSpec carries the limits and a cpuset on GPU 0's NUMA node without the 2 reserved CPUs.
    const node = await h.db
      .selectFrom('nodes')
      .where('pool_id', '=', hostPool)
      .select('spec')
      .executeTakeFirstOrThrow();
    const assignment = (node.spec as { devices: Array<Record<string, unknown>> }).devices.find(
      (d) => d.allocationId === allocation.id,
    )!;
    expect(assignment.limits).toEqual({
      cpuMillis: 4000,
      memoryBytes: 8 * 1024 ** 3,
      cpus: '2-31',
      mems: '0',
    });
    const agentNode = hostFleet.nodes[0]!;
    const driver = (
      agentNode.agent as unknown as { options: { cgroups: import('../../daemon/cgroups.ts').CgroupDriver } }
    ).options.cgroups;
    expect(driver.exists(slice)).toBe(true);
    const back = driver.readBack(slice);
    expect(back.memoryBytes).toBe(8 * 1024 ** 3);
    expect(back.cpuQuotaUs).toBe(400_000);
    expect(back.cpuPeriodUs).toBe(100_000);
    expect(back.cpus).not.toBe('');

    await h.compute.api.reservations.release(h.credential, { tenantId: 'acme', reservationId: created.id });
    await expect.poll(() => driver.exists(slice), { timeout: 60_000, interval: 200 }).toBe(false);
  });

  it('a hold the host memory cannot take is refused by the node (AllocationFailed) and stays unbound', async () => {
    // The control plane thinks 256 GiB are free; the node's own admission says otherwise.
    const hardware = hostFleet.nodes[0]!.hardware;
    (hardware.shape as { memoryGiB: number }).memoryGiB = 4;
    try {
      const created = await h.compute.api.reservations.create(h.credential, {
        tenantId: 'acme',
        poolId: hostPool,
        devices: [{ class: 'gpu', count: 1 }],
        resources: { vcpu: 1, memoryGiB: 8 },
        duration: '1h',
        idempotencyKey: 'enforce-exhausted',
      });
      await eventually(async () => {
        const rows = await h.db
          .selectFrom('allocation_reports as r')
          .innerJoin('allocations as a', 'a.id', 'r.allocation_id')
          .where('a.reservation_id', '=', created.id)
          .where('r.kind', '=', 'failed')
          .select('r.id')
          .execute();
        return rows.length > 0;
      });
      await expect
        .poll(async () => (await events(created.id)).some((e) => e.type === 'reservation.pending'), {
          timeout: 60_000,
        })
        .toBe(true);
      await h.compute.api.reservations.release(h.credential, { tenantId: 'acme', reservationId: created.id });
    } finally {
      (hardware.shape as { memoryGiB: number }).memoryGiB = 256;
    }
  });
});

describe('honest node reports', { timeout: 300_000 }, () => {
  it('a binding on a GPU the node sees unhealthy is refused, and the control plane re-places it elsewhere', async () => {
    const node = hostFleet.nodes[0]!;
    // The driver loses GPU 0 before the control plane hears of it.
    node.hardware.unhealthyGpus.add(0);
    const created = await h.compute.api.reservations.create(h.credential, {
      tenantId: 'acme',
      poolId: hostPool,
      devices: [{ class: 'gpu', count: 1 }],
      duration: '1h',
      idempotencyKey: 'enforce-replace',
    });
    await expect.poll(() => stateOf(created.id), { timeout: 90_000, interval: 200 }).toBe('active');
    const gpu0 = (await node.hardware.gpus()).gpus[0]!.uuid;
    const bound = await get(created.id);
    expect(JSON.stringify(bound)).not.toContain(gpu0);
    const history = await events(created.id);
    expect(history.map((e) => e.type)).toContain('reservation.pending');
    node.hardware.unhealthyGpus.delete(0);
    node.agent.sendInventory(['gpus']);
    await h.compute.api.reservations.release(h.credential, { tenantId: 'acme', reservationId: created.id });
  });

  it('a lost binding shows Degraded/BindingLost and clears through the gateway and the judge when the node binds again', async () => {
    const node = hostFleet.nodes[0]!;
    const created = await h.compute.api.reservations.create(h.credential, {
      tenantId: 'acme',
      poolId: hostPool,
      devices: [{ class: 'gpu', count: 1 }],
      duration: '1h',
      idempotencyKey: 'enforce-lost',
    });
    await expect.poll(() => stateOf(created.id), { timeout: 90_000, interval: 200 }).toBe('active');
    const uuid = (
      await h.db
        .selectFrom('device_bookings as b')
        .innerJoin('devices as d', 'd.id', 'b.device_id')
        .innerJoin('allocations as a', 'a.id', 'b.allocation_id')
        .where('a.reservation_id', '=', created.id)
        .select('d.stable_id')
        .executeTakeFirstOrThrow()
    ).stable_id;
    const index = node.hardware.gpus().gpus.find((g) => g.uuid === uuid)!.index;
    // The GPU falls off the driver (hidden from index on): the node can no longer honour the hold.
    node.hardware.hiddenGpus = node.hardware.shape.gpus - index;
    node.agent.convergePass();
    const conditions = async () => (await get(created.id)).conditions.map((c) => `${c.type}/${c.reason}`);
    await expect.poll(conditions, { timeout: 60_000, interval: 200 }).toContain('Degraded/BindingLost');
    node.hardware.hiddenGpus = 0;
    node.agent.sendInventory(['gpus']);
    node.agent.convergePass();
    await expect.poll(conditions, { timeout: 60_000, interval: 200 }).toEqual([]);
    const types = (await events(created.id)).map((e) => e.type);
    expect(types).toContain('reservation.binding-restored');
    const changes = (await events(created.id)).filter((e) => e.type === 'reservation.conditions-changed');
    expect(JSON.stringify(changes)).toContain('BindingLost');
    await h.compute.api.reservations.release(h.credential, { tenantId: 'acme', reservationId: created.id });
  });
});

describe('fractional GPUs', { timeout: 300_000 }, () => {
  it('books a MIG instance by profile, refuses a layout change while it is booked, and new atoms wait for the generation', async () => {
    const created = await h.compute.api.reservations.create(h.credential, {
      tenantId: 'acme',
      poolId: migPool,
      devices: [{ class: 'gpu.mig', count: 1, selector: { attributes: { profile: '1g.10gb' } } }],
      duration: '1h',
      idempotencyKey: 'enforce-mig',
    });
    await expect.poll(() => stateOf(created.id), { timeout: 90_000, interval: 200 }).toBe('active');
    expect(JSON.stringify(await get(created.id))).toContain('bcd.dev/gpu=MIG-');
    const node = await h.db
      .selectFrom('nodes')
      .where('pool_id', '=', migPool)
      .select('id')
      .executeTakeFirstOrThrow();
    const parent = await h.db
      .selectFrom('devices as d')
      .innerJoin('devices as m', 'm.parent_id', 'd.id')
      .innerJoin('device_bookings as b', 'b.device_id', 'm.id')
      .innerJoin('allocations as a', 'a.id', 'b.allocation_id')
      .where('a.reservation_id', '=', created.id)
      .select(['d.stable_id', 'd.bookable'])
      .executeTakeFirstOrThrow();
    expect(parent.bookable).toBe(false);
    // The pool owner sets layouts over the API; one that would destroy a booked instance is refused.
    const owner = {
      token: (await tenantMember(h.iam, 'platform', { role: 'admin', name: 'mig-pool-owner' })).token,
    };
    const refused = await h.compute.api.nodes
      .setMigLayout(owner, {
        nodeId: node.id,
        gpus: [{ uuid: parent.stable_id, profiles: ['3g.40gb', '3g.40gb'] }],
      })
      .then(
        () => null,
        (error: unknown) => error as { code?: string; message?: string; details?: Record<string, unknown> },
      );
    expect(refused).toMatchObject({ code: 'CONFLICT', details: { reservationIds: [created.id] } });
    expect(refused?.message).toContain(created.id);
    // Nobody else may: a member of a tenant the pool is only offered to does not see the node.
    await expect(
      h.compute.api.nodes.setMigLayout(h.credential, { nodeId: node.id, gpus: [] }),
    ).rejects.toMatchObject({ code: 'NOT_FOUND' });

    // The other GPU is free: its layout changes, and its new instances count only once converged.
    const other = await h.db
      .selectFrom('devices')
      .where('node_id', '=', node.id)
      .where('class', '=', 'gpu')
      .where('stable_id', '!=', parent.stable_id)
      .select('stable_id')
      .executeTakeFirstOrThrow();
    const { specGeneration: generation, changed } = await h.compute.api.nodes.setMigLayout(owner, {
      nodeId: node.id,
      gpus: [{ uuid: other.stable_id, profiles: ['3g.40gb', '3g.40gb'] }],
    });
    expect(changed).toBe(true);
    await eventually(async () => {
      const rows = await h.db
        .selectFrom('devices')
        .where('node_id', '=', node.id)
        .where('class', '=', 'gpu.mig')
        .where('removed_at', 'is', null)
        .where('attributes', '@>', JSON.stringify({ profile: '3g.40gb' }) as never)
        .select(['bookable_from_generation'])
        .execute();
      return rows.length === 2 && rows.every((r) => Number(r.bookable_from_generation) === generation);
    });
    await expect
      .poll(
        async () =>
          Number(
            (
              await h.db
                .selectFrom('nodes')
                .where('id', '=', node.id)
                .select('observed_generation')
                .executeTakeFirstOrThrow()
            ).observed_generation,
          ),
        { timeout: 60_000 },
      )
      .toBeGreaterThanOrEqual(generation);
    const big = await h.compute.api.reservations.create(h.credential, {
      tenantId: 'acme',
      poolId: migPool,
      devices: [{ class: 'gpu.mig', count: 1, selector: { attributes: { profile: '3g.40gb' } } }],
      duration: '1h',
      idempotencyKey: 'enforce-mig-3g',
    });
    await expect.poll(() => stateOf(big.id), { timeout: 90_000, interval: 200 }).toBe('active');
    for (const id of [created.id, big.id]) {
      await h.compute.api.reservations.release(h.credential, { tenantId: 'acme', reservationId: id });
    }
  });
});
