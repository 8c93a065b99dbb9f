import { readFileSync } from 'node:fs';
import path from 'node:path';
import { sql } from 'kysely';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { SimulatedFleet, SimulatedNode } from '../../daemon/sim.ts';
import { insertPool, offerPool } from '../../db/nodes/fleet.ts';
import type { PoolSharingMode } from '../../domain/fleet.ts';
import type { StartedGateway } from '../../gateway/server.ts';
import { billedMeters, useLifecycleApi } from '../lifecycle/harness.ts';
import { eventually } from '../support/eventually.ts';
import { joinSimulatedFleet, startTestGateway } from '../support/gateway.ts';
import { useTempDir } from '../support/temp-dir.ts';

/**
 * Shared GPUs and node health end to end: the API, the lifecycle on Temporal, the gateway with
 * mutual TLS and a short liveness lease, and simulated bcd agents. Time-slice and MPS slots are
 * placed and bound with their sharing settings in the workload's env file and CDI spec, and billed
 * on the slot meter; an active reservation shows `AtomUnhealthy` and `NodeUnreachable` from its
 * node's health and connectivity, and its events say when each is set and cleared.
 */
const h = useLifecycleApi({
  name: 'sharing-and-health',
  nodes: 0,
  // One-second usage windows stand in for hours.
  timers: { bindTimeoutMs: 30_000, usageWindowMs: 1_000 },
});
const dir = useTempDir('bc-sharing-');
let gateway: StartedGateway;
const fleets: SimulatedFleet[] = [];
const pools: Record<'time-slice' | 'mps' | 'exclusive', { id: string; node: SimulatedNode }> = {} as never;

beforeAll(async () => {
  gateway = await startTestGateway({
    db: h.db,
    log: h.log,
    lifecycle: h.lifecycle,
    options: { leaseMs: 2_000, heartbeatIntervalMs: 300 },
  });
  const policies: Record<keyof typeof pools, Record<string, unknown>> = {
    'time-slice': { sharing: { replicas: 3 } },
    mps: { sharing: { replicas: 4, mpsThreadPercentage: 30 } },
    exclusive: {},
  };
  for (const mode of Object.keys(policies) as Array<keyof typeof pools>) {
    const id = await insertPool(h.db, {
      siteId: h.siteId,
      ownerTenantId: 'platform',
      name: `h100-${mode}`,
      gpuModel: 'h100',
      sharingMode: mode as PoolSharingMode,
      policy: { perGpu: { vcpu: 0, memoryGiB: 0 }, ...policies[mode] },
    });
    await offerPool(h.db, { poolId: id, tenantId: 'acme', quota: { gpu: 8, 'gpu.slot': 16 } });
    const fleet = await joinSimulatedFleet(gateway, h.db, id, {
      nodes: 1,
      rootDir: `${dir}/${mode}`,
      log: h.log,
      namePrefix: mode,
      minBackoffMs: 100,
      maxBackoffMs: 1_000,
      shape: { gpus: 2 },
    });
    fleets.push(fleet);
    pools[mode] = { id, node: fleet.nodes[0]! };
  }
  await eventually(async () => {
    const rows = await h.db
      .selectFrom('nodes as n')
      .where('n.provision_state', '=', 'ready')
      .where('n.observed_generation', '>=', '1')
      .where((eb) => eb.exists(eb.selectFrom('devices as d').whereRef('d.node_id', '=', 'n.id')))
      .select('n.id')
      .execute();
    return rows.length === 3;
  });
});

afterAll(async () => {
  for (const fleet of fleets) await fleet.stop();
  await gateway?.stop();
});

const get = (id: string) =>
  h.compute.api.reservations.get(h.credential, { tenantId: 'acme', reservationId: id });
const stateOf = async (id: string) => (await get(id)).state;
const conditionsOf = async (id: string) =>
  (await get(id)).conditions.map((c) => `${c.type}/${c.reason}`).sort();
const conditionEvents = async (id: string) =>
  (
    await h.db
      .selectFrom('outbox_events')
      .where('subject', '=', `reservation/${id}`)
      .where('type', '=', 'reservation.conditions-changed')
      .select('data')
      .orderBy('id')
      .execute()
  ).map((e) => {
    const data = e.data as Record<
      'set' | 'cleared',
      Array<{ type: string; reason: string; message: string }>
    >;
    const name = (c: { type: string; reason: string }) => `${c.type}/${c.reason}`;
    return { set: data.set.map(name), cleared: data.cleared.map(name) };
  });

/** An active reservation of one atom in `pool`, with its allocation and the GPUs its atoms are on. */
async function reserveOne(pool: keyof typeof pools, key: string) {
  const created = await h.compute.api.reservations.create(h.credential, {
    tenantId: 'acme',
    poolId: pools[pool].id,
    devices: [{ class: pool === 'exclusive' ? 'gpu' : 'gpu.slot', count: 1 }],
    duration: '1h',
    idempotencyKey: key,
  });
  await expect.poll(() => stateOf(created.id), { timeout: 30_000, interval: 200 }).toBe('active');
  const booked = await h.db
    .selectFrom('device_bookings as b')
    .innerJoin('devices as d', 'd.id', 'b.device_id')
    .innerJoin('allocations as a', 'a.id', 'b.allocation_id')
    .where('a.reservation_id', '=', created.id)
    .select(['a.id as allocationId', 'd.stable_id', 'd.class', 'd.attributes'])
    .executeTakeFirstOrThrow();
  const gpuUuid = (booked.attributes as { parentUuid?: string }).parentUuid ?? booked.stable_id;
  return { id: created.id, allocationId: booked.allocationId, atom: booked, gpuUuid };
}

describe('time-slice and MPS slots, end to end', () => {
  it('a time-slice pool makes policy.sharing.replicas slots per GPU; a slot binds with its sharing settings and bills on the slot meter', async () => {
    const node = await h.db
      .selectFrom('nodes')
      .where('pool_id', '=', pools['time-slice'].id)
      .select('id')
      .executeTakeFirstOrThrow();
    const atoms = await h.db
      .selectFrom('devices')
      .where('node_id', '=', node.id)
      .where('removed_at', 'is', null)
      .select(['class', 'bookable'])
      .execute();
    expect(atoms.filter((a) => a.class === 'gpu.slot' && a.bookable)).toHaveLength(2 * 3);
    expect(atoms.filter((a) => a.class === 'gpu').every((a) => !a.bookable)).toBe(true);

    const r = await reserveOne('time-slice', 'slot-ts');
    expect(r.atom.class).toBe('gpu.slot');
    expect(r.atom.stable_id).toMatch(/^GPU-.+-slot-[0-2]$/);
    const simNode = pools['time-slice'].node;
    const env = readFileSync(path.join(simNode.dir, 'allocations', `${r.allocationId}.env`), 'utf8');
    expect(env).toContain(`NVIDIA_VISIBLE_DEVICES=${r.gpuUuid}\n`);
    expect(env).toContain('BCD_SHARING_MODE=time-slice\n');
    expect(env).toContain('BCD_SHARING_REPLICAS=3\n');
    expect(env).not.toContain('CUDA_MPS_');
    // The reservation's binding names the slot's CDI device.
    expect(JSON.stringify(await get(r.id))).toContain(`bcd.dev/gpu=${r.atom.stable_id}`);

    // Billing: closed one-second windows on gpu.h100.slot.hours, a third of a GPU each.
    await expect
      .poll(
        async () =>
          (
            await h.db
              .selectFrom('usage_windows')
              .where('reservation_id', '=', r.id)
              .where('sent_at', 'is not', null)
              .select('meter')
              .execute()
          ).length,
        { timeout: 30_000, interval: 250 },
      )
      .toBeGreaterThanOrEqual(2);
    await h.compute.api.reservations.release(h.credential, { tenantId: 'acme', reservationId: r.id });
    await expect.poll(() => stateOf(r.id), { timeout: 20_000, interval: 200 }).toBe('released');
    await h.temporal.client.workflow.getHandle(r.id).result();
    const windows = await h.db
      .selectFrom('usage_windows')
      .where('reservation_id', '=', r.id)
      .select(['meter', 'quantity', 'sent_at'])
      .execute();
    expect(new Set(windows.map((w) => w.meter))).toEqual(new Set(['gpu.h100.slot.hours']));
    expect(windows.every((w) => w.sent_at !== null)).toBe(true);
    const allocation = await h.db
      .selectFrom('allocations')
      .where('id', '=', r.allocationId)
      .select(['bound_at', 'released_at'])
      .executeTakeFirstOrThrow();
    const billedMs = allocation.released_at!.getTime() - allocation.bound_at!.getTime();
    const total = windows.reduce((sum, w) => sum + Number(w.quantity), 0);
    // Each window's quantity is rounded to a millionth (db/reservations/usage.ts): half of one each at most.
    expect(Math.abs(total - (billedMs / 3_600_000) * (1 / 3))).toBeLessThanOrEqual(
      windows.length * 5e-7 + 1e-9,
    );
    const ledger = await sql<{ meter: string }>`SELECT meter FROM iam.usage_records
      WHERE subject = ${`reservation/${r.id}/allocation/${r.allocationId}`}`.execute(h.db);
    expect(ledger.rows.length).toBe(windows.length);
    expect(new Set(ledger.rows.map((l) => l.meter))).toEqual(new Set(['gpu.h100.slot.hours']));
  });

  it("an MPS slot gets the pool's thread percentage and its GPU's MPS pipe directory, in the env file and the CDI spec", async () => {
    const r = await reserveOne('mps', 'slot-mps');
    expect(r.atom.stable_id).toMatch(/^GPU-.+-slot-[0-3]$/);
    const simNode = pools.mps.node;
    const env = readFileSync(path.join(simNode.dir, 'allocations', `${r.allocationId}.env`), 'utf8');
    const expected = [
      'BCD_SHARING_MODE=mps',
      'BCD_SHARING_REPLICAS=4',
      'CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=30',
      `CUDA_MPS_PIPE_DIRECTORY=/run/bcd/mps/${r.gpuUuid}`,
    ];
    for (const line of expected) expect(env).toContain(`${line}\n`);
    const cdi = JSON.parse(
      readFileSync(path.join(simNode.dir, 'cdi', `bcd-${r.allocationId}.json`), 'utf8'),
    ) as {
      containerEdits: { env: string[] };
      devices: Array<{ name: string; containerEdits: { env: string[] } }>;
    };
    expect(cdi.containerEdits.env).toEqual(expect.arrayContaining(expected));
    expect(cdi.devices).toEqual([
      { name: r.atom.stable_id, containerEdits: { env: [`NVIDIA_VISIBLE_DEVICES=${r.gpuUuid}`] } },
    ]);
    await h.compute.api.reservations.release(h.credential, { tenantId: 'acme', reservationId: r.id });
    await expect.poll(() => stateOf(r.id), { timeout: 20_000, interval: 200 }).toBe('released');
    expect(await billedMeters(h, r.id)).toEqual(['gpu.h100.slot.hours']);
  });
});

describe('node health and connectivity on an active reservation, through the gateway', () => {
  it('AtomUnhealthy is set when the node reports its GPU unhealthy and cleared when healthy again; it stays bound and active', async () => {
    const r = await reserveOne('exclusive', 'health-gpu');
    const node = pools.exclusive.node;
    const index = node.hardware.gpus().gpus.find((g) => g.uuid === r.gpuUuid)!.index;
    node.hardware.unhealthyGpus.add(index);
    node.agent.sendInventory(['gpus']);
    await expect
      .poll(() => conditionsOf(r.id), { timeout: 20_000, interval: 200 })
      .toEqual(['Degraded/AtomUnhealthy']);
    expect((await get(r.id)).conditions[0]!.message).toBe(`unhealthy: ${r.gpuUuid}`);
    // The node re-checks its holds: an unhealthy GPU it still has is no lost binding.
    node.agent.convergePass();
    await expect
      .poll(
        async () =>
          (
            await h.db
              .selectFrom('allocation_reports')
              .where('allocation_id', '=', r.allocationId)
              .where('kind', '=', 'failed')
              .select('id')
              .execute()
          ).length,
      )
      .toBe(0);
    expect(await stateOf(r.id)).toBe('active');

    node.hardware.unhealthyGpus.delete(index);
    node.agent.sendInventory(['gpus']);
    await expect.poll(() => conditionsOf(r.id), { timeout: 20_000, interval: 200 }).toEqual([]);
    expect(await conditionEvents(r.id)).toEqual([
      { set: ['Degraded/AtomUnhealthy'], cleared: [] },
      { set: [], cleared: ['Degraded/AtomUnhealthy'] },
    ]);
    await h.compute.api.reservations.release(h.credential, { tenantId: 'acme', reservationId: r.id });
  });

  it('NodeUnreachable is set when the node falls silent past its lease and cleared when it reconnects; nothing is released', async () => {
    const r = await reserveOne('exclusive', 'health-unreachable');
    const node = pools.exclusive.node;
    node.agent.silence(true);
    try {
      await expect
        .poll(() => conditionsOf(r.id), { timeout: 20_000, interval: 200 })
        .toEqual(['NodeUnreachable/Unreachable']);
      expect((await get(r.id)).conditions[0]!.message).toBe(`not connected: ${node.nodeId}`);
      expect(await stateOf(r.id)).toBe('active');
    } finally {
      node.agent.silence(false);
    }
    await expect.poll(() => conditionsOf(r.id), { timeout: 30_000, interval: 200 }).toEqual([]);
    const allocation = await h.db
      .selectFrom('allocations')
      .where('id', '=', r.allocationId)
      .select('state')
      .executeTakeFirstOrThrow();
    expect(allocation.state).toBe('bound');
    expect(await stateOf(r.id)).toBe('active');
    expect(await conditionEvents(r.id)).toEqual([
      { set: ['NodeUnreachable/Unreachable'], cleared: [] },
      { set: [], cleared: ['NodeUnreachable/Unreachable'] },
    ]);
    await h.compute.api.reservations.release(h.credential, { tenantId: 'acme', reservationId: r.id });
  });
});
