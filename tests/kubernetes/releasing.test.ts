import { sql } from 'kysely';
import { beforeAll, describe, expect, it } from 'vitest';
import { advanceComputeClock } from '../../db/clock.ts';
import { releaseCarryLimitMs, releaseCarryStepMs } from '../../domain/kubernetes-release.ts';
import { useLifecycleApi } from '../lifecycle/harness.ts';
import { eventually } from '../support/eventually.ts';
import { gpuResource, useKubernetesNode } from './harness.ts';

/**
 * The release of a `kubernetes` binding, through the real parts: the API, the lifecycle on
 * Temporal, the gateway with mutual TLS and a simulated bcd, with this test playing the kubelet
 * over unix sockets in the device plugin API v1beta1 (the stand-in admits pods through
 * GetPreferredAllocation and Allocate, and keeps its checkpoint as the kubelet does). Pods that
 * hold a released reservation's GPUs keep it `releasing` with DevicesHeld/PodsHoldDevices; their
 * going finishes it; a release held past the end is carried, then forced at the 24-hour limit.
 */
const h = useLifecycleApi({ name: 'k8s-release', nodes: 0, timers: { bindTimeoutMs: 30_000 } });
const k8s = useKubernetesNode(h, 'bc-k8s-rel-');
const { advertised, get, stateOf } = k8s;

beforeAll(async () => {
  await eventually(async () => k8s.kubelet.resourceNames().includes(gpuResource));
});

const release = (id: string) =>
  h.compute.api.reservations.release(h.credential, { tenantId: 'acme', reservationId: id });
const reserveActive = async (key: string, count: number) => {
  const created = await h.compute.api.reservations.create(h.credential, {
    tenantId: 'acme',
    poolId: k8s.poolId,
    devices: [{ class: 'gpu', count }],
    duration: '1h',
    idempotencyKey: key,
    binding: 'kubernetes',
  });
  await expect.poll(() => stateOf(created.id), { timeout: 30_000, interval: 200 }).toBe('active');
  return created.id;
};
/** The reservation's allocations with their state, billing end and bookings' window. */
const allocationsOf = async (reservationId: string) =>
  (
    await sql<{
      id: string;
      state: string;
      released_at: Date | null;
      end: Date;
      booked_from: Date;
      booked_until: Date;
      devices: string[];
    }>`SELECT a.id, a.state, a.released_at, upper(a.during) AS end,
         (SELECT min(lower(b.during)) FROM device_bookings b WHERE b.allocation_id = a.id) AS booked_from,
         (SELECT max(upper(b.during)) FROM device_bookings b WHERE b.allocation_id = a.id) AS booked_until,
         (SELECT array_agg(d.stable_id ORDER BY d.stable_id) FROM device_bookings b JOIN devices d ON d.id = b.device_id
           WHERE b.allocation_id = a.id) AS devices
       FROM allocations a WHERE a.reservation_id = ${reservationId} ORDER BY a.id`.execute(h.db)
  ).rows;
const eventsOf = async (reservationId: string) =>
  (
    await sql<{ type: string; data: Record<string, unknown> }>`
      SELECT type, data FROM outbox_events WHERE subject = ${`reservation/${reservationId}`} ORDER BY id`.execute(
      h.db,
    )
  ).rows;

describe('releasing a kubernetes binding', () => {
  it('with no pod holding its GPUs, finishes at once', async () => {
    const id = await reserveActive('rel-free', 1);
    const [allocation] = await allocationsOf(id);
    await expect.poll(advertised, { timeout: 10_000 }).toEqual(allocation!.devices);
    const answer = await release(id);
    expect(['releasing', 'released']).toContain(answer.state);
    await expect.poll(() => stateOf(id), { timeout: 30_000, interval: 200 }).toBe('released');
    expect(advertised()).toEqual([]);
    const [ended] = await allocationsOf(id);
    expect(ended).toMatchObject({ state: 'released' });
    // Booked until the node reported the GPUs free (the release's finish), no longer.
    expect(ended!.booked_until.getTime()).toBeGreaterThanOrEqual(ended!.released_at!.getTime());
    expect(ended!.booked_until.getTime()).toBeLessThan(ended!.end.getTime());
  });

  it('a pod holding its GPUs keeps it releasing with DevicesHeld/PodsHoldDevices, booked, until the pod goes', async () => {
    const id = await reserveActive('rel-held', 2);
    const [allocation] = await allocationsOf(id);
    await expect.poll(advertised, { timeout: 10_000 }).toEqual(allocation!.devices);
    const pod = await k8s.kubelet.admit('train-0', gpuResource, 1);
    const podGpu = pod.containerResponses[0]!.cdiDevices[0]!.name.slice('bcd.dev/gpu='.length);
    expect(allocation!.devices).toContain(podGpu);

    const answer = await release(id);
    expect(answer.state).toBe('releasing');
    const held = answer.conditions.find((c) => c.type === 'DevicesHeld');
    expect(held).toMatchObject({
      reason: 'PodsHoldDevices',
      message: expect.stringContaining(k8s.node.nodeId),
    });
    expect(held!.since).toEqual(expect.any(Number));
    expect(answer.allocations).toEqual([expect.objectContaining({ state: 'releasing' })]);
    // bcd stops advertising them at once: no new pod gets them.
    await expect.poll(advertised, { timeout: 20_000 }).toEqual([]);
    await expect(k8s.kubelet.admit('train-1', gpuResource, 1)).rejects.toThrow(/allocatable/);
    // The pod still runs: the release waits, the GPUs stay booked to the end.
    k8s.node.agent.convergePass();
    const listed = await h.compute.api.reservations.list(h.credential, {
      tenantId: 'acme',
      state: 'releasing',
    });
    expect(listed.reservations.map((r: { id: string }) => r.id)).toContain(id);
    expect(await stateOf(id)).toBe('releasing');
    const [stillBooked] = await allocationsOf(id);
    expect(stillBooked).toMatchObject({ state: 'releasing', released_at: null });
    expect(stillBooked!.booked_until.getTime()).toBe(stillBooked!.end.getTime());
    // A second release changes nothing.
    expect((await release(id)).state).toBe('releasing');
    expect((await eventsOf(id)).map((e) => e.type)).toContain('reservation.releasing');

    k8s.kubelet.removePod('train-0');
    await expect.poll(() => stateOf(id), { timeout: 30_000, interval: 200 }).toBe('released');
    const done = await get(id);
    expect(done.conditions.map((c) => c.type)).not.toContain('DevicesHeld');
    expect(done.endReason).toBe('release');
    const [ended] = await allocationsOf(id);
    expect(ended).toMatchObject({ state: 'released' });
    // Freed when the node reported the pod gone: booked until then, billed at most that long.
    expect(ended!.released_at!.getTime()).toBeGreaterThanOrEqual(held!.since!);
    expect(ended!.booked_until.getTime()).toBeGreaterThanOrEqual(ended!.released_at!.getTime());
    expect(ended!.booked_until.getTime()).toBeLessThan(ended!.end.getTime());
    const report = await h.db
      .selectFrom('allocation_reports')
      .where('allocation_id', '=', ended!.id)
      .where('kind', '=', 'released')
      .select('id')
      .execute();
    expect(report.length).toBeGreaterThan(0);
  });

  it('held past its end, the release is carried in 5-minute steps, then forced after 24 hours with nothing billed past the end', async () => {
    const id = await reserveActive('rel-carry', 1);
    const [allocation] = await allocationsOf(id);
    await expect.poll(advertised, { timeout: 10_000 }).toEqual(allocation!.devices);
    await k8s.kubelet.admit('train-2', gpuResource, 1);
    const end = allocation!.end.getTime();

    // The end passes with the pod still running: released (expired) into releasing, then carried.
    const { rows } = await sql<{ now: Date }>`SELECT compute_now() AS now`.execute(h.db);
    await advanceComputeClock(h.db, end - rows[0]!.now.getTime() + 10_000);
    await h.lifecycle.signal(id, { type: 'wake', reason: 'test' });
    await expect.poll(() => stateOf(id), { timeout: 30_000, interval: 200 }).toBe('releasing');
    await expect
      .poll(async () => (await allocationsOf(id))[0]!.booked_until.getTime(), {
        timeout: 30_000,
        interval: 200,
      })
      .toBeGreaterThanOrEqual(end + releaseCarryStepMs);
    const carried = (await allocationsOf(id))[0]!;
    expect(carried).toMatchObject({ state: 'releasing', released_at: null });
    expect(carried.end.getTime()).toBe(end);
    expect(carried.booked_until.getTime()).toBeLessThanOrEqual(end + 10_000 + releaseCarryStepMs + 60_000);
    expect((await get(id)).endReason).toBe('expired');
    expect((await get(id)).conditions).toContainEqual(
      expect.objectContaining({ type: 'DevicesHeld', reason: 'PodsHoldDevices' }),
    );

    // 24 hours past the end the pod still holds it: force-released, with the event.
    await advanceComputeClock(h.db, releaseCarryLimitMs);
    await h.lifecycle.signal(id, { type: 'wake', reason: 'test' });
    await expect.poll(() => stateOf(id), { timeout: 30_000, interval: 200 }).toBe('released');
    await h.temporal.client.workflow.getHandle(id).result();
    const events = await eventsOf(id);
    expect(events.find((e) => e.type === 'reservation.release-forced')?.data).toMatchObject({
      reason: 'carry-limit',
      allocationIds: [allocation!.id],
      nodeIds: [k8s.node.nodeId],
    });
    expect(events.find((e) => e.type === 'reservation.released')?.data).toMatchObject({
      reason: 'expired',
      forced: 'carry-limit',
    });
    const [ended] = await allocationsOf(id);
    expect(ended).toMatchObject({ state: 'released' });

    // The billing ledger: every window before the end, the GPU-hours no more than bound time to the end.
    const windows = await h.db
      .selectFrom('usage_windows')
      .where('reservation_id', '=', id)
      .selectAll()
      .orderBy('hour_start')
      .execute();
    expect(windows.length).toBeGreaterThan(0);
    expect(windows.every((w) => new Date(w.hour_start).getTime() < end)).toBe(true);
    const { rows: bound } = await sql<{ bound_at: Date }>`
      SELECT bound_at FROM allocations WHERE id = ${allocation!.id}`.execute(h.db);
    const total = windows.reduce((sum, w) => sum + Number(w.quantity), 0);
    expect(total).toBeCloseTo((end - bound[0]!.bound_at.getTime()) / 3_600_000, 5);
    await expect
      .poll(
        async () =>
          (
            await sql<{ n: number }>`SELECT count(*)::int AS n FROM iam.usage_records
              WHERE subject = ${`reservation/${id}/allocation/${allocation!.id}`}`.execute(h.db)
          ).rows[0]!.n,
        { timeout: 20_000 },
      )
      .toBe(windows.length);
    k8s.kubelet.removePod('train-2');
  });
});
