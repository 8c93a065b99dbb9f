import { sql } from 'kysely';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { advanceComputeClock, readComputeNow } from '../../db/clock.ts';
import { machineTurnaroundMs } from '../../domain/dedicated-root.ts';
import { createCompute } from '../../server/compute.ts';
import { callApi } from '../support/api.ts';
import { eventually } from '../support/eventually.ts';
import { type TenantMember, tenantMember } from '../support/iam.ts';
import { testLogger } from '../support/logger.ts';
import { useTempDir } from '../support/temp-dir.ts';
import { type MetalDeployHarness, startMetalDeployHarness } from './harness.ts';

/**
 * Dedicated root (`binding: 'node'`) end to end over the Redfish emulator, nothing faked: a
 * tenant leases a whole bare machine of a tenantRoot pool; at the start its profile is deployed
 * through the site agent and the ramdisk, the allocation is bound once the deployed system joined;
 * on release the ramdisk wipes the disk (`cleaning` → `ready`) and only then are the bookings freed.
 */
describe('dedicated root: whole bare machines leased with a profile deployed, wiped on release', () => {
  const dir = useTempDir('bc-metal-lease-');
  const log = testLogger('metal-lease');
  let h: MetalDeployHarness;
  let lessee: TenantMember;
  let profileId: string;
  let plainPoolId: string;
  /** The API with the reservation lifecycles on the harness's worker. */
  let compute: ReturnType<typeof createCompute>;

  // biome-ignore lint/suspicious/noExplicitAny: answers are read field by field
  const asLessee = (method: string, body: unknown): Promise<{ status: number; body: any }> =>
    callApi(compute.app, lessee.token, method, body);
  const lease = (extra: Record<string, unknown> = {}) => ({
    tenantId: lessee.tenantId,
    poolId: h.site.poolId,
    devices: [{ class: 'gpu', count: 1 }],
    duration: '2h',
    binding: 'node',
    node: { profileId },
    ...extra,
  });
  const bookingsOf = (allocationId: string) =>
    h.api.database.db
      .selectFrom('device_bookings')
      .where('allocation_id', '=', allocationId)
      .select([sql<boolean>`upper(during) > compute_now()`.as('live')])
      .execute();

  /** Runs `wait`; when it times out, the error says where the lease stands. */
  const within = async <T>(reservationId: string, wait: () => Promise<T>): Promise<T> => {
    try {
      return await wait();
    } catch (error) {
      const got = await asLessee('reservations/get', { tenantId: lessee.tenantId, reservationId });
      const workflows = await h.api.database.db
        .selectFrom('metal_workflows')
        .select(['id', 'kind', 'state', 'reason', 'allocation_id'])
        .execute();
      const nodes = await h.api.database.db
        .selectFrom('nodes')
        .select(['id', 'provision_state', 'maintenance', 'maintenance_reason'])
        .execute();
      throw new Error(
        `nodes: ${JSON.stringify(nodes)}; ` +
          `${(error as Error).message}; the lease: ${JSON.stringify(got.body.data ?? got.body)}; workflows: ${JSON.stringify(workflows)}`,
      );
    }
  };

  /** Waits until the lease is in `state` and answers it; a timeout says where the lease stands. */
  const untilLeaseState = (reservationId: string, state: string, ms: number) =>
    within(reservationId, () =>
      eventually(async () => {
        const got = await asLessee('reservations/get', { tenantId: lessee.tenantId, reservationId });
        return got.body.data?.state === state ? got.body.data : null;
      }, ms),
    );

  /** Creates a one-machine lease and waits until it is active on its deployed machine. */
  const activeLease = async (idempotencyKey: string, duration: string) => {
    const created = await asLessee('reservations/create', lease({ idempotencyKey, duration }));
    expect(created.status, JSON.stringify(created.body)).toBe(200);
    return untilLeaseState(created.body.data.id, 'active', 420_000);
  };
  const cleanOf = (allocationId: string) =>
    eventually(
      () =>
        h.api.database.db
          .selectFrom('metal_workflows')
          .where('allocation_id', '=', allocationId)
          .where('kind', '=', 'clean')
          .selectAll()
          .executeTakeFirst(),
      60_000,
    );

  beforeAll(async () => {
    h = await startMetalDeployHarness({ dir, log, machines: 2, name: 'lease' });
    compute = createCompute({
      ...h.api.deps,
      temporal: h.temporal.client,
      lifecycle: h.temporal.lifecycle,
      config: { ...h.api.deps.config, BETTER_COMPUTE_TASK_QUEUE: h.temporal.taskQueue },
    });
    lessee = await tenantMember(h.api.iam, 'lessee');
    // The pool of the site's machines offers whole machines with root on them.
    await h.call('admin/setPoolPolicy', { poolId: h.site.poolId, policy: { tenantRoot: true } });
    await h.call('admin/offer', { poolId: h.site.poolId, tenantId: lessee.tenantId, quota: { gpu: 4 } });
    plainPoolId = (
      await h.call('admin/createPool', { siteId: h.site.siteId, name: 'plain', gpuModel: 'h100' })
    ).id;
    await h.call('admin/offer', { poolId: plainPoolId, tenantId: lessee.tenantId, quota: { gpu: 4 } });
    // The signed (public) image, and a profile of the lessee's own deploying it.
    await h.signedProfile('root-profile');
    const image = await h.api.database.db
      .selectFrom('images')
      .where('name', '=', 'ubuntu')
      .select('id')
      .executeTakeFirstOrThrow();
    profileId = (
      await h.call('profiles/create', {
        tenantId: lessee.tenantId,
        name: 'lessee-gpu-node',
        spec: {
          imageId: image.id,
          acceptance: ['inventory-reported', 'gpus-present'],
          stepTimeoutSeconds: 120,
          maxAttempts: 2,
        },
      })
    ).id;
    await eventually(async () => {
      const rows = await h.api.database.db
        .selectFrom('nodes')
        .where('id', 'in', h.site.machines)
        .select('provision_state')
        .execute();
      return rows.every((r) => r.provision_state === 'ready');
    }, 300_000);
  }, 600_000);

  afterAll(async () => {
    await h?.stop();
  });

  it('refuses a pool without tenantRoot, a spot lease, and a lease without its profile, changing nothing', async () => {
    const plain = await asLessee(
      'reservations/create',
      lease({ poolId: plainPoolId, idempotencyKey: 'plain' }),
    );
    expect(plain.body.error).toMatchObject({
      code: 'INVALID_INPUT',
      message: expect.stringMatching(
        /only a pool whose policy sets tenantRoot: true offers; pool .* does not/,
      ),
    });
    const spot = await asLessee('reservations/create', lease({ spot: true, idempotencyKey: 'spot' }));
    expect(spot.body.error.code).toBe('INVALID_INPUT');
    expect(JSON.stringify(spot.body.error)).toMatch(/cannot be spot/);
    const { node: _node, ...noProfile } = lease({ idempotencyKey: 'no-profile' });
    const missing = await asLessee('reservations/create', noProfile);
    expect(missing.body.error).toMatchObject({
      code: 'INVALID_INPUT',
      message: expect.stringMatching(/^node: /),
    });
    const foreign = await asLessee(
      'reservations/create',
      lease({ node: { profileId: 'prof_00000000000000000000000000' }, idempotencyKey: 'foreign' }),
    );
    expect(foreign.body.error).toMatchObject({
      code: 'INVALID_INPUT',
      message: expect.stringMatching(/node.profileId/),
    });
    const rows = await h.api.database.db
      .selectFrom('reservations')
      .where('tenant_id', '=', lessee.tenantId)
      .where('state', 'not in', ['denied', 'draft'])
      .select('id')
      .execute();
    expect(rows).toEqual([]);
  });

  it('a tainted machine is not leased, though its NodeUnreachable (powered off) is excused', async () => {
    const db = h.api.database.db;
    const machine = h.site.machines[0]!;
    // Powered off after its inspection, the machine's session lapsed: NodeUnreachable stands.
    await eventually(
      () =>
        db
          .selectFrom('node_conditions')
          .where('node_id', '=', machine)
          .where('type', '=', 'NodeUnreachable')
          .select('type')
          .executeTakeFirst(),
      120_000,
    );
    await h.call('nodes/taint', { nodeId: machine, reason: 'bad-fan' });
    try {
      const created = await asLessee(
        'reservations/create',
        lease({ idempotencyKey: 'tainted', devices: [{ class: 'gpu', count: 2 }] }),
      );
      expect(created.status, JSON.stringify(created.body)).toBe(200);
      expect(created.body.data.state).not.toBe('placed');
      expect(JSON.stringify(created.body.data.conditions)).toMatch(/Taint:bad-fan/);
      await asLessee('reservations/cancel', {
        tenantId: lessee.tenantId,
        reservationId: created.body.data.id,
      });
    } finally {
      await h.call('nodes/untaint', { nodeId: machine, reason: 'bad-fan' });
    }
  });

  it('leases a whole ready machine: deployed at the start, active once joined; on release wiped, ready, then freed', async () => {
    const db = h.api.database.db;
    const created = await asLessee('reservations/create', lease({ idempotencyKey: 'lease-1' }));
    expect(created.status, JSON.stringify(created.body)).toBe(200);
    const reservation = created.body.data;
    expect(reservation.request.node).toEqual({ profileId, profileVersion: 1 });
    expect(reservation.allocations).toHaveLength(1);
    const allocation = reservation.allocations[0];
    expect(h.site.machines).toContain(allocation.nodeId);
    // Every bookable atom of the machine is booked: both of its GPUs.
    const gpus = await db
      .selectFrom('devices')
      .where('node_id', '=', allocation.nodeId)
      .where('class', '=', 'gpu')
      .select('id')
      .execute();
    expect([...allocation.deviceIds].sort()).toEqual(gpus.map((g) => g.id).sort());
    // The machine is booked through the wipe after the lease; the allocation (what is billed) is not.
    const spans = await db
      .selectFrom('device_bookings as b')
      .innerJoin('allocations as a', 'a.id', 'b.allocation_id')
      .where('a.id', '=', allocation.id)
      .select([sql<Date>`upper(b.during)`.as('booked'), sql<Date>`upper(a.during)`.as('billed')])
      .execute();
    expect(spans.map((x) => x.booked.getTime() - x.billed.getTime())).toEqual([
      machineTurnaroundMs,
      machineTurnaroundMs,
    ]);

    // The lifecycle starts the deploy of the lease's profile on that machine.
    const deploy = await within(reservation.id, () =>
      eventually(
        () =>
          db
            .selectFrom('metal_workflows')
            .where('allocation_id', '=', allocation.id)
            .where('kind', '=', 'deploy')
            .selectAll()
            .executeTakeFirst(),
        60_000,
      ),
    );
    expect(deploy).toMatchObject({
      node_id: allocation.nodeId,
      tenant_id: lessee.tenantId,
      profile_id: profileId,
    });
    const deployed = await h.until(deploy.id, (wf) => wf.state !== 'running', 300_000);
    expect(deployed.state).toBe('succeeded');
    expect(
      deployed.steps
        .filter((s: { phase: string }) => s.phase === 'main')
        .map((s: { name: string }) => s.name),
    ).toEqual([
      'check-image',
      'power-off',
      'boot-network',
      'power-on-ramdisk',
      'wipe-disk',
      'write-image',
      'boot-disk',
      'reboot-into-image',
      'acceptance',
    ]);
    const active = await untilLeaseState(reservation.id, 'active', 120_000);
    expect(active.allocations[0].state).toBe('bound');
    const system = h.systems[h.site.machines.indexOf(allocation.nodeId)]!;
    expect(h.machines.running(system.uuid)).toBe('os');
    expect(h.machines.disk(system.uuid)?.image).toMatchObject({ name: 'ubuntu' });
    expect(await h.call('nodes/get', { nodeId: allocation.nodeId })).toMatchObject({
      provisionState: 'deployed',
      role: 'node',
    });

    // Release: the reservation is over at once, the machine keeps its bookings while it is wiped.
    const released = await asLessee('reservations/release', {
      tenantId: lessee.tenantId,
      reservationId: reservation.id,
    });
    expect(released.status, JSON.stringify(released.body)).toBe(200);
    const clean = await within(reservation.id, () =>
      eventually(
        () =>
          db
            .selectFrom('metal_workflows')
            .where('allocation_id', '=', allocation.id)
            .where('kind', '=', 'clean')
            .selectAll()
            .executeTakeFirst(),
        60_000,
      ),
    );
    const cleaning = await db
      .selectFrom('allocations')
      .where('id', '=', allocation.id)
      .select('state')
      .executeTakeFirstOrThrow();
    expect(['releasing', 'released']).toContain(cleaning.state);
    if (cleaning.state === 'releasing') {
      expect((await bookingsOf(allocation.id)).every((b) => b.live)).toBe(true);
      // Nobody else gets the machine while it is wiped.
      const other = await asLessee(
        'reservations/create',
        lease({ idempotencyKey: 'while-cleaning', devices: [{ class: 'gpu', count: 2 }] }),
      );
      expect(other.body.data?.state ?? other.body.error?.code).not.toBe('placed');
      if (other.body.data)
        await asLessee('reservations/cancel', {
          tenantId: lessee.tenantId,
          reservationId: other.body.data.id,
        });
    }
    const wiped = await h.until(clean.id, (wf) => wf.state !== 'running', 300_000);
    expect(wiped.state).toBe('succeeded');
    expect(wiped.steps.find((s: { name: string }) => s.name === 'wipe-disk')).toMatchObject({
      state: 'succeeded',
      target: 'ramdisk',
    });
    expect(await h.call('nodes/get', { nodeId: allocation.nodeId })).toMatchObject({
      provisionState: 'ready',
      maintenance: false,
    });
    expect(h.machines.disk(system.uuid)).toBeNull();
    expect(h.machines.running(system.uuid)).toBeNull();
    // Only now are the bookings freed.
    expect(
      await db
        .selectFrom('allocations')
        .where('id', '=', allocation.id)
        .select('state')
        .executeTakeFirstOrThrow(),
    ).toEqual({ state: 'released' });
    expect((await bookingsOf(allocation.id)).some((b) => b.live)).toBe(false);
    const events = await db
      .selectFrom('outbox_events')
      .where((eb) =>
        eb.or([
          eb('subject', '=', `node/${allocation.nodeId}`),
          eb('subject', '=', `reservation/${reservation.id}`),
        ]),
      )
      .orderBy('seq')
      .select(['type', 'data'])
      .execute();
    const types = events.map((e) => e.type);
    expect(types).toContain('reservation.machine-freed');
    const moves = events
      .filter((e) => e.type === 'node.provision-state-changed')
      .map((e) => (e.data as { to: string }).to);
    expect(moves.slice(-4)).toEqual(['deploying', 'deployed', 'cleaning', 'ready']);
    // The machine is free again: a new lease gets it.
    const again = await asLessee(
      'reservations/create',
      lease({
        idempotencyKey: 'lease-2',
        devices: [{ class: 'gpu', count: 2 }],
        start: Date.now() + 3_600_000,
      }),
    );
    expect(again.body.data?.state, JSON.stringify(again.body)).toBe('placed');
    expect(again.body.data.allocations.map((a: { nodeId: string }) => a.nodeId).sort()).toEqual(
      [...h.site.machines].sort(),
    );
    await asLessee('reservations/cancel', { tenantId: lessee.tenantId, reservationId: again.body.data.id });
  }, 900_000);

  it('at the natural end the machine stays booked while it is wiped, then is freed, unbilled past the end', async () => {
    const db = h.api.database.db;
    // A short lease, so the clock moves only minutes to its end.
    const active = await activeLease('natural-end', '10m');
    const allocation = active.allocations[0];
    // An extend moves the turnaround along with the end.
    const extended = await asLessee('reservations/extend', {
      tenantId: lessee.tenantId,
      reservationId: active.id,
      by: '5m',
      idempotencyKey: 'natural-end-extend',
    });
    expect(extended.body.data, JSON.stringify(extended.body)).toMatchObject({ extended: true });
    const end = extended.body.data.reservation.during.end as number;
    expect(end).toBe(active.during.end + 5 * 60_000);
    const tails = await db
      .selectFrom('device_bookings')
      .where('allocation_id', '=', allocation.id)
      .select(sql<Date>`upper(during)`.as('until'))
      .execute();
    expect(tails.map((t) => t.until.getTime())).toEqual([
      end + machineTurnaroundMs,
      end + machineTurnaroundMs,
    ]);

    // The lease's end passes (the clock moved there): the lifecycle ends it and the wipe begins.
    // The clock moves back once it has: certificates and TLS live by the wall clock, and the
    // ramdisk that wipes the machine must join under it.
    const jump = end - (await readComputeNow(db)).getTime() + 1_000;
    await advanceComputeClock(db, jump);
    try {
      await h.temporal.lifecycle.signal(active.id, { type: 'wake', reason: 'test' });
      await untilLeaseState(active.id, 'released', 60_000);
    } finally {
      await advanceComputeClock(db, -jump);
    }
    const clean = await within(active.id, () => cleanOf(allocation.id));
    const during = await db
      .selectFrom('allocations')
      .where('id', '=', allocation.id)
      .select(['state', sql<Date>`upper(during)`.as('until')])
      .executeTakeFirstOrThrow();
    // Billed to the end only; booked on past it, so nothing else starts on the machine mid-wipe.
    expect(during.until.getTime()).toBe(end);
    if (during.state === 'releasing') {
      expect((await bookingsOf(allocation.id)).every((b) => b.live)).toBe(true);
      const next = await asLessee(
        'reservations/create',
        lease({ idempotencyKey: 'after-natural-end', devices: [{ class: 'gpu', count: 2 }] }),
      );
      expect(next.body.data?.state ?? next.body.error?.code).not.toBe('placed');
      if (next.body.data)
        await asLessee('reservations/cancel', {
          tenantId: lessee.tenantId,
          reservationId: next.body.data.id,
        });
    }
    const wiped = await h.until(clean.id, (wf) => wf.state !== 'running', 300_000);
    expect(wiped.state, JSON.stringify(wiped.steps)).toBe('succeeded');
    expect(await h.call('nodes/get', { nodeId: allocation.nodeId })).toMatchObject({
      provisionState: 'ready',
      maintenance: false,
    });
    expect((await bookingsOf(allocation.id)).some((b) => b.live)).toBe(false);
    // Billed GPU-hours: at most the machine's two GPUs over the lease's window, nothing for the wipe.
    const billed = await db
      .selectFrom('usage_windows')
      .where('reservation_id', '=', active.id)
      .select(sql<string>`coalesce(sum(quantity), 0)`.as('hours'))
      .executeTakeFirstOrThrow();
    expect(Number(billed.hours)).toBeLessThanOrEqual((2 * (end - active.during.start)) / 3_600_000 + 1e-6);
  }, 900_000);

  it('a deploy that fails fails the lease: DeployFailed with the reason, the machine in maintenance, nothing left booked', async () => {
    const db = h.api.database.db;
    // The image server refuses every download: write-image fails both of its attempts.
    h.image.failRequests = 1_000_000;
    try {
      const created = await asLessee('reservations/create', lease({ idempotencyKey: 'doomed' }));
      expect(created.status, JSON.stringify(created.body)).toBe(200);
      const id: string = created.body.data.id;
      const allocation = created.body.data.allocations[0];
      const failed = await untilLeaseState(id, 'failed', 600_000);
      const condition = failed.conditions.find((c: { reason: string }) => c.reason === 'DeployFailed');
      expect(condition?.message).toMatch(
        new RegExp(`on node ${allocation.nodeId} failed: .*failed at step write-image`),
      );
      const node = await h.call('nodes/get', { nodeId: allocation.nodeId });
      expect(node.maintenance).toBe(true);
      expect(node.maintenanceReason).toMatch(/failed at step write-image/);
      // It was placed once, never a second time, and holds nothing now.
      const allocations = await db
        .selectFrom('allocations')
        .where('reservation_id', '=', id)
        .select('state')
        .execute();
      expect(allocations).toEqual([{ state: expect.stringMatching(/failed|released/) }]);
      expect((await bookingsOf(allocation.id)).some((b) => b.live)).toBe(false);
    } finally {
      h.image.failRequests = 0;
    }
  }, 900_000);
});
