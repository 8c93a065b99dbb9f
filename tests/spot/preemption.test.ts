import { readdirSync, readFileSync } from 'node:fs';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it, vi } from 'vitest';
import type { SimulatedFleet } from '../../daemon/sim.ts';
import { checkBookingInvariants } from '../../db/allocations/invariants.ts';
import { advanceComputeClock, readComputeNow } from '../../db/clock.ts';
import type { StartedGateway } from '../../gateway/server.ts';
import { preemptionWakeSignal } from '../../workflows/preemption/messages.ts';
import { billedMeters, eventTypes, useLifecycleApi } from '../lifecycle/harness.ts';
import { eventually } from '../support/eventually.ts';
import { joinSimulatedFleet, startTestGateway } from '../support/gateway.ts';
import { useTempDir } from '../support/temp-dir.ts';

// A machine shared by several engineers' suites: a step may take tens of seconds.
vi.setConfig({ testTimeout: 300_000 });
/**
 * Spot preemption end to end: the reservations API, the lifecycles and the preemption workflow on
 * the real Temporal dev server, the gateway with mutual TLS, and a simulated bcd node of 4 GPUs
 * that binds, receives the notice in its NodeSpec and writes it beside the allocation's env file.
 */
const h = useLifecycleApi({
  name: 'spot-preemption',
  nodes: 0,
  timers: { bindTimeoutMs: 60_000, maxPendingMs: 600_000 },
  pool: { ownerTenantId: 'platform', gpuQuota: 32 },
});
const dir = useTempDir('bc-spot-');
let gateway: StartedGateway;
let fleet: SimulatedFleet;

beforeAll(async () => {
  gateway = await startTestGateway({ db: h.db, log: h.log, lifecycle: h.lifecycle });
  fleet = await joinSimulatedFleet(gateway, h.db, h.poolId, {
    nodes: 1,
    rootDir: dir,
    log: h.log,
    shape: { gpus: 4, nvlinkDomainSize: 4 },
  });
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
const create = (key: string, gpus: number, extra: Record<string, unknown> = {}) =>
  h.compute.api.reservations.create(h.credential, {
    tenantId: 'acme',
    poolId: h.poolId,
    devices: [{ class: 'gpu', count: gpus }],
    duration: '2h',
    idempotencyKey: key,
    ...extra,
  });

/** Every file under `root` whose name ends with `suffix`. */
function filesEnding(root: string, suffix: string): string[] {
  const out: string[] = [];
  for (const entry of readdirSync(root, { withFileTypes: true, recursive: true })) {
    if (entry.isFile() && entry.name.endsWith(suffix)) out.push(path.join(entry.parentPath, entry.name));
  }
  return out;
}

describe('a regular request preempting two spot reservations', () => {
  it('notices both on the node, starts at the deadline, releases them at it and bills spot on its meter', async () => {
    const spots = [await create('spot-a', 2, { spot: true }), await create('spot-b', 2, { spot: true })];
    for (const s of spots) {
      await expect
        .poll(async () => (await get(s.id)).state, { timeout: 60_000, interval: 200 })
        .toBe('active');
    }

    const now = (await readComputeNow(h.db)).getTime();
    const regular = await create('regular', 4);
    expect(regular.state).toBe('placed');
    const deadline = regular.during!.start;
    // The pool's default notice: 120 s from the decision.
    expect(deadline - now).toBeGreaterThanOrEqual(120_000);
    expect(deadline - now).toBeLessThan(150_000);

    for (const s of spots) {
      const view = await get(s.id);
      expect(view.state).toBe('active');
      expect(view.during!.end).toBe(deadline);
      expect(view.conditions).toContainEqual(
        expect.objectContaining({
          type: 'Preempted',
          reason: 'SpotPreempted',
          deadline,
          preemptedBy: regular.id,
        }),
      );
      expect(await eventTypes(h, s.id)).toContain('reservation.preempting');
    }
    // The windows touch, never overlap: the database's referee agrees.
    expect(await checkBookingInvariants(h.db)).toEqual({ deviceOverlaps: 0, scalarOverbookings: 0 });

    // The notice reaches the node: a file beside each allocation's env file, and BCD_PREEMPT_AT in it.
    await expect.poll(() => filesEnding(dir, '.preempt').length, { timeout: 60_000, interval: 200 }).toBe(2);
    for (const file of filesEnding(dir, '.preempt')) {
      expect(readFileSync(file, 'utf8')).toContain(`BCD_PREEMPT_AT=${deadline}`);
      expect(readFileSync(file.replace(/\.preempt$/, '.env'), 'utf8')).toContain(
        `BCD_PREEMPT_AT=${deadline}`,
      );
    }

    // The preemption is its own workflow, searchable by the reservation that preempts.
    const workflowId = `preemption-${regular.id}-${deadline}`;
    const handle = h.temporal.client.workflow.getHandle(workflowId);
    await expect.poll(async () => (await handle.describe()).status.name, { timeout: 60_000 }).toBe('RUNNING');
    const described = await handle.describe();
    expect(described.type).toBe('spotPreemption');

    // At the deadline (the clock moved past it), the spot ones are released with reason preempted.
    await advanceComputeClock(h.db, deadline - now + 1_000);
    await handle.signal(preemptionWakeSignal, { reason: 'test' });
    expect(await handle.result()).toEqual({ released: [...spots.map((s) => s.id)].sort() });
    for (const s of spots) {
      const view = await get(s.id);
      expect(view).toMatchObject({ state: 'released', endReason: 'preempted' });
      expect(await eventTypes(h, s.id)).toContain('reservation.preempted');
    }
    await expect.poll(() => filesEnding(dir, '.preempt').length, { timeout: 60_000, interval: 200 }).toBe(0);

    // The regular one binds as usual.
    await h.lifecycle.signal(regular.id, { type: 'wake', reason: 'test' });
    await expect
      .poll(async () => (await get(regular.id)).state, { timeout: 60_000, interval: 200 })
      .toBe('active');

    // Spot is billed on the spot meter only; the regular one on the regular meter. Each lifecycle
    // writes its last windows as it ends: wait for the workflows, not for a count of rows (a span
    // that crosses the hour is two windows).
    for (const s of spots) await h.temporal.client.workflow.getHandle(s.id).result();
    const meters = await h.db
      .selectFrom('usage_windows')
      .where(
        'reservation_id',
        'in',
        spots.map((s) => s.id),
      )
      .select(['reservation_id', 'meter', 'quantity'])
      .execute();
    expect(new Set(meters.map((m) => m.reservation_id))).toEqual(new Set(spots.map((s) => s.id)));
    for (const m of meters) {
      expect(m.meter).toMatch(/^gpu\.[a-z0-9 -]+\.spot\.hours$/);
      expect(Number(m.quantity)).toBeGreaterThan(0);
    }
    await h.compute.api.reservations.release(h.credential, { tenantId: 'acme', reservationId: regular.id });
    expect(await billedMeters(h, regular.id)).toEqual([expect.not.stringContaining('.spot.')]);
  });
});
