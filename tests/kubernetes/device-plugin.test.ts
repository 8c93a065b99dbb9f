import path from 'node:path';
import { credentials, Server, ServerCredentials, type ServerWritableStream, status } from '@grpc/grpc-js';
import { beforeAll, describe, expect, it, vi } from 'vitest';
import { kubernetesBindingCapability } from '../../daemon/agent.ts';
import { insertPool, offerPool } from '../../db/nodes/fleet.ts';
import {
  type AllocateResponse,
  type DevicePluginClient,
  DevicePluginService,
  type ListAndWatchResponse,
  type PreferredAllocationResponse,
  RegistrationClient,
} from '../../proto/gen/deviceplugin/v1beta1/api.ts';
import { useLifecycleApi } from '../lifecycle/harness.ts';
import { eventually } from '../support/eventually.ts';
import { gpuResource, useKubernetesNode } from './harness.ts';

/**
 * bcd as a Kubernetes device plugin, through the real parts: the API, the lifecycle on Temporal,
 * the gateway with mutual TLS and a simulated bcd, with this test playing the kubelet over unix
 * sockets in the device plugin API v1beta1 (Registration on kubelet.sock, then ListAndWatch,
 * GetPreferredAllocation and Allocate on the plugin's own socket).
 */
// Each case waits on several lifecycles in turn: a busy machine needs more than the default minute.
vi.setConfig({ testTimeout: 240_000 });
const h = useLifecycleApi({ name: 'k8s-plugin', nodes: 0, timers: { bindTimeoutMs: 120_000 } });
const k8s = useKubernetesNode(h, 'bc-k8s-');
const { advertised, get, stateOf } = k8s;
let gpus: Array<{ uuid: string; nvlinkDomain: string | null }>;

beforeAll(() => {
  gpus = k8s.node.hardware.gpus().gpus;
});

const reserve = (key: string, count: number, binding?: 'kubernetes') =>
  h.compute.api.reservations.create(h.credential, {
    tenantId: 'acme',
    poolId: k8s.poolId,
    devices: [{ class: 'gpu', count }],
    duration: '1h',
    idempotencyKey: key,
    ...(binding ? { binding } : {}),
  });
const bookedGpus = async (reservationId: string) =>
  (
    await h.db
      .selectFrom('allocations as a')
      .innerJoin('device_bookings as b', 'b.allocation_id', 'a.id')
      .innerJoin('devices as d', 'd.id', 'b.device_id')
      .where('a.reservation_id', '=', reservationId)
      .where('a.superseded_at', 'is', null)
      .select('d.stable_id')
      .execute()
  )
    .map((r) => r.stable_id)
    .sort();
const allocate = (client: DevicePluginClient, ids: string[]) =>
  new Promise<AllocateResponse>((resolve, reject) =>
    client.allocate({ containerRequests: [{ devicesIds: ids }] }, (err, res) =>
      err ? reject(err) : resolve(res),
    ),
  );
const prefer = (client: DevicePluginClient, available: string[], mustInclude: string[], size: number) =>
  new Promise<PreferredAllocationResponse>((resolve, reject) =>
    client.getPreferredAllocation(
      {
        containerRequests: [
          { availableDeviceIDs: available, mustIncludeDeviceIDs: mustInclude, allocationSize: size },
        ],
      },
      (err, res) => (err ? reject(err) : resolve(res)),
    ),
  );
const domainOf = (uuid: string) => gpus.find((g) => g.uuid === uuid)?.nvlinkDomain;

describe('registration and the capability', () => {
  it('bcd says binding.kubernetes in Hello, the gateway makes it a system label, and the plugin registers bcd.dev/gpu', async () => {
    const labels = await h.db
      .selectFrom('node_labels')
      .where('node_id', '=', k8s.node.nodeId)
      .where('key', '=', `bc.dev/cap.${kubernetesBindingCapability}`)
      .select(['value', 'source'])
      .execute();
    expect(labels).toEqual([{ value: 'true', source: 'system' }]);
    await expect.poll(() => k8s.kubelet.resourceNames(), { timeout: 60_000 }).toEqual([gpuResource]);
    expect(k8s.kubelet.registrations[0]).toMatchObject({
      version: 'v1beta1',
      endpoint: 'bcd-gpu.sock',
      resourceName: gpuResource,
      options: { getPreferredAllocationAvailable: true, preStartRequired: false },
    });
    // Nothing is booked: nothing is advertised.
    expect(advertised()).toEqual([]);
  });
});

describe('what the kubelet is given', () => {
  it('advertises exactly the GPUs of live kubernetes bindings, never a hold, and follows bookings as they start and end', async () => {
    const hold = await reserve('k8s-hold', 1);
    await expect.poll(() => stateOf(hold.id), { timeout: 90_000, interval: 200 }).toBe('active');
    const first = await reserve('k8s-first', 2, 'kubernetes');
    await expect.poll(() => stateOf(first.id), { timeout: 90_000, interval: 200 }).toBe('active');
    const firstGpus = await bookedGpus(first.id);
    expect(firstGpus).toHaveLength(2);
    await expect.poll(advertised, { timeout: 45_000 }).toEqual(firstGpus);
    expect(advertised()).not.toContain((await bookedGpus(hold.id))[0]);
    expect(k8s.kubelet.devices(gpuResource).every((d) => d.health === 'Healthy')).toBe(true);

    const second = await reserve('k8s-second', 1, 'kubernetes');
    await expect.poll(() => stateOf(second.id), { timeout: 90_000, interval: 200 }).toBe('active');
    const both = [...firstGpus, ...(await bookedGpus(second.id))].sort();
    await expect.poll(advertised, { timeout: 45_000 }).toEqual(both);

    await h.compute.api.reservations.release(h.credential, { tenantId: 'acme', reservationId: first.id });
    await expect.poll(advertised, { timeout: 60_000 }).toEqual(await bookedGpus(second.id));
    await h.compute.api.reservations.release(h.credential, { tenantId: 'acme', reservationId: second.id });
    await h.compute.api.reservations.release(h.credential, { tenantId: 'acme', reservationId: hold.id });
    await expect.poll(advertised, { timeout: 60_000 }).toEqual([]);
  });

  it('Allocate answers the CDI device names and env of booked GPUs and refuses any other id; GetPreferredAllocation keeps a pod on one NVLink domain', async () => {
    const whole = await reserve('k8s-whole', 4, 'kubernetes');
    await expect.poll(() => stateOf(whole.id), { timeout: 90_000, interval: 200 }).toBe('active');
    const all = await bookedGpus(whole.id);
    await expect.poll(advertised, { timeout: 45_000 }).toEqual(all);
    const client = k8s.kubelet.client(gpuResource);

    const answer = await allocate(client, [all[0]!, all[1]!]);
    expect(answer.containerResponses).toHaveLength(1);
    const container = answer.containerResponses[0]!;
    expect(container.cdiDevices.map((d) => d.name)).toEqual([
      `bcd.dev/gpu=${all[0]}`,
      `bcd.dev/gpu=${all[1]}`,
    ]);
    expect(container.envs.NVIDIA_VISIBLE_DEVICES).toBe(`${all[0]},${all[1]}`);
    const allocationId = (
      await h.db
        .selectFrom('allocations')
        .where('reservation_id', '=', whole.id)
        .select('id')
        .executeTakeFirstOrThrow()
    ).id;
    expect(container.envs.BCD_ALLOCATION_ID).toBe(allocationId);

    const refused = await allocate(client, [all[0]!, 'GPU-00000000-0000-0000-0000-000000000000']).catch(
      (e: { code: number; details: string }) => e,
    );
    expect(refused).toMatchObject({ code: status.FAILED_PRECONDITION });
    expect((refused as { details: string }).details).toContain('is not booked to a kubernetes binding');

    // Two of four, any two available: both from one domain.
    const two = (await prefer(client, all, [], 2)).containerResponses[0]!.deviceIDs;
    expect(two).toHaveLength(2);
    expect(domainOf(two[0]!)).toBe(domainOf(two[1]!));
    // One of them must be included: its domain sibling completes it, whatever the order offered.
    const pinned = [...all].reverse()[0]!;
    const withPinned = (await prefer(client, [...all].reverse(), [pinned], 2)).containerResponses[0]!
      .deviceIDs;
    expect(withPinned[0]).toBe(pinned);
    expect(domainOf(withPinned[1]!)).toBe(domainOf(pinned));
    // Ids the plugin does not advertise are never preferred.
    const foreign = (await prefer(client, ['GPU-x', all[0]!], [], 2)).containerResponses[0]!.deviceIDs;
    expect(foreign).toEqual([all[0]]);

    // The stand-in kubelet admits a pod the same way: preferred, then allocated.
    const pod = await k8s.kubelet.admit('train-0', gpuResource, 2);
    const podGpus = pod.containerResponses[0]!.cdiDevices.map((d) => d.name.slice('bcd.dev/gpu='.length));
    expect(domainOf(podGpus[0]!)).toBe(domainOf(podGpus[1]!));
    k8s.kubelet.removePod('train-0');

    await h.compute.api.reservations.release(h.credential, { tenantId: 'acme', reservationId: whole.id });
    await expect.poll(advertised, { timeout: 60_000 }).toEqual([]);
    const late = await allocate(client, [all[0]!]).catch((e: { code: number }) => e);
    expect(late).toMatchObject({ code: status.FAILED_PRECONDITION });
  });

  it('advertises a booked GPU that turned unhealthy as Unhealthy, and keeps it advertised', async () => {
    const one = await reserve('k8s-unhealthy', 1, 'kubernetes');
    await expect.poll(() => stateOf(one.id), { timeout: 90_000, interval: 200 }).toBe('active');
    const [uuid] = await bookedGpus(one.id);
    await expect.poll(advertised, { timeout: 45_000 }).toEqual([uuid]);
    const index = gpus.findIndex((g) => g.uuid === uuid);
    k8s.node.hardware.unhealthyGpus.add(index);
    try {
      k8s.node.agent.convergePass();
      await expect
        .poll(() => k8s.kubelet.devices(gpuResource), { timeout: 45_000 })
        .toEqual([expect.objectContaining({ ID: uuid, health: 'Unhealthy' })]);
    } finally {
      k8s.node.hardware.unhealthyGpus.delete(index);
      k8s.node.agent.convergePass();
    }
    await h.compute.api.reservations.release(h.credential, { tenantId: 'acme', reservationId: one.id });
    await expect.poll(advertised, { timeout: 60_000 }).toEqual([]);
  });
});

describe('binding', () => {
  it('a kubernetes binding becomes active only once the plugin has advertised its GPUs to a kubelet', async () => {
    await k8s.kubelet.stop();
    try {
      const one = await reserve('k8s-no-kubelet', 1, 'kubernetes');
      await expect.poll(() => stateOf(one.id), { timeout: 90_000, interval: 200 }).toBe('binding');
      // The node holds it (CDI spec written) but no kubelet has its list: no bound report.
      await eventually(async () => k8s.node.agent.status.held.some((held) => held.binding === 'kubernetes'));
      k8s.node.agent.convergePass();
      const reports = await h.db
        .selectFrom('allocation_reports as r')
        .innerJoin('allocations as a', 'a.id', 'r.allocation_id')
        .where('a.reservation_id', '=', one.id)
        .select('r.kind')
        .execute();
      expect(reports).toEqual([]);
      expect(await stateOf(one.id)).toBe('binding');
      await k8s.kubelet.start();
      await expect.poll(() => stateOf(one.id), { timeout: 90_000, interval: 200 }).toBe('active');
      expect(advertised()).toEqual(await bookedGpus(one.id));
      await h.compute.api.reservations.release(h.credential, { tenantId: 'acme', reservationId: one.id });
      await expect.poll(advertised, { timeout: 60_000 }).toEqual([]);
    } finally {
      if (k8s.kubelet.resourceNames().length === 0) await k8s.kubelet.start().catch(() => {});
    }
  });

  it('a tenant a kubernetes pool is only offered to gets INVALID_INPUT with the reason', async () => {
    const offered = await insertPool(h.db, {
      siteId: h.siteId,
      ownerTenantId: 'platform',
      name: 'k8s-offered',
      gpuModel: 'h100',
      policy: { kubernetes: true },
    });
    await offerPool(h.db, { poolId: offered, tenantId: 'acme', quota: { gpu: 16 } });
    await expect(
      h.compute.api.reservations.create(h.credential, {
        tenantId: 'acme',
        poolId: offered,
        devices: [{ class: 'gpu', count: 1 }],
        duration: '1h',
        idempotencyKey: 'k8s-offered',
        binding: 'kubernetes',
      }),
    ).rejects.toMatchObject({
      code: 'INVALID_INPUT',
      message: expect.stringContaining(`only the owner of pool ${offered} may book it for kubernetes`),
    });
  });
});

describe('ForeignGpuExposure', () => {
  it('another device plugin registering nvidia.com/gpu makes the node report ForeignGpuExposure and an active reservation Degraded, until it goes', async () => {
    const one = await reserve('k8s-foreign', 1, 'kubernetes');
    await expect.poll(() => stateOf(one.id), { timeout: 90_000, interval: 200 }).toBe('active');
    // Another vendor plugin on the same kubelet, advertising this node's GPUs as nvidia.com/gpu.
    const socket = path.join(k8s.node.kubeletDir!, 'nvidia-gpu.sock');
    const foreign = new Server();
    foreign.addService(DevicePluginService, {
      getDevicePluginOptions: (_call: unknown, done: (e: null, r: object) => void) =>
        done(null, { preStartRequired: false, getPreferredAllocationAvailable: false }),
      listAndWatch: (stream: ServerWritableStream<unknown, ListAndWatchResponse>) => {
        stream.write({ devices: gpus.map((g) => ({ ID: g.uuid, health: 'Healthy', topology: undefined })) });
      },
      getPreferredAllocation: (_call: unknown, done: (e: null, r: object) => void) =>
        done(null, { containerResponses: [] }),
      allocate: (_call: unknown, done: (e: null, r: object) => void) =>
        done(null, { containerResponses: [] }),
      preStartContainer: (_call: unknown, done: (e: null, r: object) => void) => done(null, {}),
    });
    await new Promise<void>((resolve, reject) =>
      foreign.bindAsync(`unix://${socket}`, ServerCredentials.createInsecure(), (err) =>
        err ? reject(err) : resolve(),
      ),
    );
    try {
      const registration = new RegistrationClient(
        `unix://${path.join(k8s.node.kubeletDir!, 'kubelet.sock')}`,
        credentials.createInsecure(),
      );
      await new Promise<void>((resolve, reject) =>
        registration.register(
          {
            version: 'v1beta1',
            endpoint: 'nvidia-gpu.sock',
            resourceName: 'nvidia.com/gpu',
            options: undefined,
          },
          (err) => (err ? reject(err) : resolve()),
        ),
      );
      registration.close();
      await expect
        .poll(async () => (await get(one.id)).conditions, { timeout: 90_000, interval: 200 })
        .toContainEqual(expect.objectContaining({ type: 'Degraded', reason: 'ForeignGpuExposure' }));
      const condition = await h.db
        .selectFrom('node_conditions')
        .where('node_id', '=', k8s.node.nodeId)
        .where('type', '=', 'ForeignGpuExposure')
        .select('message')
        .executeTakeFirstOrThrow();
      expect(condition.message).toContain('nvidia.com/gpu');
      expect(await stateOf(one.id)).toBe('active');
    } finally {
      foreign.forceShutdown();
    }
    await expect
      .poll(async () => (await get(one.id)).conditions.map((c: { reason: string }) => c.reason), {
        timeout: 90_000,
        interval: 200,
      })
      .not.toContain('ForeignGpuExposure');
    await h.compute.api.reservations.release(h.credential, { tenantId: 'acme', reservationId: one.id });
    await expect.poll(advertised, { timeout: 60_000 }).toEqual([]);
  });
});

describe('kubelet restarts', () => {
  it('a new kubelet.sock (the kubelet restarted and cleared its sockets) gets the plugin registered again, with its list', async () => {
    const one = await reserve('k8s-restart', 1, 'kubernetes');
    await expect.poll(() => stateOf(one.id), { timeout: 90_000, interval: 200 }).toBe('active');
    const booked = await bookedGpus(one.id);
    await expect.poll(advertised, { timeout: 45_000 }).toEqual(booked);
    const before = k8s.kubelet.registrations.length;
    await k8s.kubelet.restart();
    expect(k8s.kubelet.devices(gpuResource)).toEqual([]);
    await expect.poll(() => k8s.kubelet.registrations.length, { timeout: 60_000 }).toBeGreaterThan(before);
    await expect.poll(advertised, { timeout: 45_000 }).toEqual(booked);
    await h.compute.api.reservations.release(h.credential, { tenantId: 'acme', reservationId: one.id });
    await expect.poll(advertised, { timeout: 60_000 }).toEqual([]);
  });
});
