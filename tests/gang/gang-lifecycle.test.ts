import { sql } from 'kysely';
import { afterAll, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import type { SimulatedFleet } from '../../daemon/sim.ts';
import { registerReadyNodes } from '../../db/nodes/fleet.ts';
import { setOperatorLabels } from '../../db/nodes/labels.ts';
import type { StartedGateway } from '../../gateway/server.ts';
import { eventTypes, useLifecycleApi, waitForState } from '../lifecycle/harness.ts';
import { eventually } from '../support/eventually.ts';
import { markNodesHeard } from '../support/fleet.ts';
import { joinSimulatedFleet, startTestGateway } from '../support/gateway.ts';
import { useTempDir } from '../support/temp-dir.ts';

/**
 * Gangs on real parts: the API, the lifecycle on Temporal, the gateway with mutual TLS and
 * simulated bcd nodes (8 GPUs each) that bind, plus one node registered without a daemon (it never
 * binds). Nodes are grouped by the operator label `fabric.domain`.
 */
const h = useLifecycleApi({
  name: 'gang-lifecycle',
  nodes: 0,
  timers: { bindTimeoutMs: 8_000 },
  pool: { ownerTenantId: 'platform', gpuQuota: 72 },
});
const dir = useTempDir('bc-gang-');
let gateway: StartedGateway;
let fleet: SimulatedFleet;
/** sim-0000 … sim-0006, by index. */
let sim: string[] = [];
/** A ready, connected node with no daemon: it is placed on and never binds. */
let silent: string;

const key = 'fabric.domain';
const label = (nodeIds: string[], value: string) =>
  setOperatorLabels(
    h.db,
    nodeIds.map((nodeId) => ({ nodeId, key, value })),
  );
const cordon = (nodeId: string, cordoned: boolean) =>
  h.db.updateTable('nodes').set({ cordoned }).where('id', '=', nodeId).execute();

beforeAll(async () => {
  gateway = await startTestGateway({ db: h.db, log: h.log, lifecycle: h.lifecycle });
  fleet = await joinSimulatedFleet(gateway, h.db, h.poolId, { nodes: 7, rootDir: dir, log: h.log });
  await eventually(async () => {
    const { rows } = await sql<{ n: number }>`
        SELECT count(*)::int AS n FROM nodes n WHERE n.pool_id = ${h.poolId} AND n.provision_state = 'ready'
          AND n.connectivity = 'connected' AND COALESCE(n.observed_generation, 0) >= 1
          AND EXISTS (SELECT 1 FROM devices d WHERE d.node_id = n.id)`.execute(h.db);
    return rows[0]!.n === 7;
  }, 60_000);
  sim = [...fleet.nodes].sort((a, b) => a.name.localeCompare(b.name)).map((n) => n.nodeId);
  [{ id: silent }] = await registerReadyNodes(h.db, {
    siteId: h.siteId,
    poolId: h.poolId,
    count: 1,
    namePrefix: 'silent',
  }).then((nodes) => nodes.map((n) => ({ id: n.id })));
  // fabric-a: 3 nodes, fabric-b: 4 nodes, fabric-r: the silent node alone.
  await label(sim.slice(0, 3), 'fabric-a');
  await label(sim.slice(3, 7), 'fabric-b');
  await label([silent], 'fabric-r');
}, 120_000);

beforeEach(async () => {
  if (silent) await markNodesHeard(h.db, [silent]);
});

afterAll(async () => {
  await fleet?.stop();
  await gateway?.stop();
});

const cred = () => h.credential;
const get = (id: string) => h.compute.api.reservations.get(cred(), { tenantId: 'acme', reservationId: id });
const gang = (
  size: number,
  count: number,
  idempotencyKey: string,
  topologyKey: string | undefined = key,
) => ({
  tenantId: 'acme',
  poolId: h.poolId,
  devices: [{ class: 'gpu' as const, count }],
  duration: '1h',
  gang: { size, ...(topologyKey ? { topologyKey } : {}) },
  idempotencyKey,
});
const gpuUsed = async () =>
  Number(
    (
      await h.db
        .selectFrom('quotas')
        .select('used')
        .where('tenant_id', '=', 'acme')
        .where('resource', '=', 'gpu')
        .executeTakeFirstOrThrow()
    ).used,
  );
const currentAllocations = (reservationId: string) =>
  h.db
    .selectFrom('allocations')
    .where('reservation_id', '=', reservationId)
    .where('superseded_at', 'is', null)
    .select(['id', 'node_id', 'state', 'gang_index', 'member_attempt', sql<Date>`upper(during)`.as('until')])
    .orderBy('gang_index')
    .execute();

describe('a 4-node gang with a topology key', () => {
  let id: string;

  it('is placed on the one fabric.domain value with 4 free nodes, and active once every member is bound', async () => {
    const created = await h.compute.api.reservations.create(cred(), gang(4, 8, 'gang-4'));
    id = created.id;
    expect(created.state).toBe('placed');
    expect(created.gang).toEqual({ size: 4, topologyKey: key, topologyValue: 'fabric-b' });
    expect(created.allocations.map((a) => a.gangIndex)).toEqual([0, 1, 2, 3]);
    expect(new Set(created.allocations.map((a) => a.nodeId))).toEqual(new Set(sim.slice(3, 7)));
    await expect.poll(async () => (await get(id)).state, { timeout: 30_000, interval: 250 }).toBe('active');
    const active = await get(id);
    expect(active.allocations.every((a) => a.state === 'bound')).toBe(true);
    // One request for quota: 4 nodes × 8 GPUs charged once.
    expect(await gpuUsed()).toBe(32);
    const attributes = await h.db
      .selectFrom('authz_projection')
      .select('attributes')
      .where('resource_id', '=', id)
      .executeTakeFirstOrThrow();
    expect(attributes.attributes).toMatchObject({ gangSize: 4, gpuCount: 32 });
  });

  it('names every topology value and why it was rejected when another gang does not fit', async () => {
    const { idempotencyKey: _key, ...request } = gang(4, 8, 'unused');
    const preview = await h.compute.api.capacity.preview(cred(), request);
    expect(preview.fits).toBe(false);
    expect(preview.message).toContain('no fabric.domain value has 4 nodes that fit');
    expect(preview.message).toContain('fabric.domain=fabric-a: 3 of 3 nodes fit');
    expect(preview.message).toContain('fabric.domain=fabric-b: 0 of 4 nodes fit (4 lack 8 free GPUs)');
    expect(preview.message).toContain('fabric.domain=fabric-r: 1 of 1 node fit');
    expect(preview.gang?.values.map((v) => [v.value, v.fitting, v.nodes])).toEqual([
      ['fabric-a', 3, 3],
      ['fabric-b', 0, 4],
      ['fabric-r', 1, 1],
    ]);
    // The counter-offer: the earliest start is when the active gang ends.
    expect(preview.earliestStart).toBe((await get(id)).during!.end);

    const pending = await h.compute.api.reservations.create(cred(), gang(4, 8, 'gang-4-nofit'));
    expect(pending.state).toBe('pending');
    const noFit = pending.conditions.find((c) => c.reason === 'NoFit');
    expect(noFit?.message).toContain('fabric.domain=fabric-b: 0 of 4 nodes fit');
    expect(pending.allocations).toEqual([]);
    await h.compute.api.reservations.cancel(cred(), { tenantId: 'acme', reservationId: pending.id });
    await waitForState(h, pending.id, 'cancelled');
    expect(await gpuUsed()).toBe(32);
  });

  it('a gang is charged all or nothing: over the quota, nothing is booked or charged', async () => {
    // 32 used of 72: a gang of 6 × 8 = 48 does not fit the quota as a whole.
    await expect(
      h.compute.api.reservations.create(cred(), gang(6, 8, 'gang-6', undefined)),
    ).rejects.toMatchObject({
      code: 'QUOTA_EXCEEDED',
    });
    expect(await gpuUsed()).toBe(32);
    const { rows } = await sql<{ n: number }>`
      SELECT count(*)::int AS n FROM allocations a JOIN reservations r ON r.id = a.reservation_id
      WHERE r.idempotency_key = 'gang-6'`.execute(h.db);
    expect(rows[0]!.n).toBe(0);
  });

  it('a lost binding on one member makes the gang Degraded, naming the member', async () => {
    const [, member] = await currentAllocations(id);
    await h.db
      .updateTable('allocations')
      .set({ binding_lost_at: sql<Date>`compute_now()` })
      .where('id', '=', member!.id)
      .execute();
    await h.lifecycle.signal(id, { type: 'wake', reason: 'test' });
    await expect
      .poll(async () => (await get(id)).conditions.find((c) => c.type === 'Degraded')?.message, {
        timeout: 20_000,
      })
      .toContain(`member 1 (node ${member!.node_id})`);
    await h.db
      .updateTable('allocations')
      .set({ binding_lost_at: null })
      .where('id', '=', member!.id)
      .execute();
    await h.lifecycle.signal(id, { type: 'wake', reason: 'test' });
    await expect
      .poll(async () => (await get(id)).conditions.some((c) => c.type === 'Degraded'), { timeout: 20_000 })
      .toBe(false);
  });

  it('extends and releases every member at once', async () => {
    const before = await get(id);
    const extended = await h.compute.api.reservations.extend(cred(), {
      tenantId: 'acme',
      reservationId: id,
      by: '1h',
      idempotencyKey: 'gang-4-extend',
    });
    expect(extended.reservation.during!.end).toBe(before.during!.end + 3_600_000);
    const members = await currentAllocations(id);
    expect(members).toHaveLength(4);
    expect(members.every((a) => a.until.getTime() === extended.reservation.during!.end)).toBe(true);
    const { rows } = await sql<{ n: number }>`
      SELECT count(*)::int AS n FROM device_bookings b JOIN allocations a ON a.id = b.allocation_id
      WHERE a.reservation_id = ${id} AND upper(b.during) = ${new Date(extended.reservation.during!.end).toISOString()}::timestamptz`.execute(
      h.db,
    );
    expect(rows[0]!.n).toBe(32);

    const released = await h.compute.api.reservations.release(cred(), {
      tenantId: 'acme',
      reservationId: id,
    });
    expect(released.state).toBe('released');
    const after = await h.db
      .selectFrom('allocations')
      .where('reservation_id', '=', id)
      .select(['state', 'superseded_at'])
      .execute();
    expect(after).toHaveLength(4);
    expect(after.every((a) => a.state === 'released' && a.superseded_at !== null)).toBe(true);
    expect(await gpuUsed()).toBe(0);
    // Every member's node loses its assignment.
    await expect
      .poll(
        async () => {
          const nodes = await h.db
            .selectFrom('nodes')
            .select('spec')
            .where('id', 'in', sim.slice(3, 7))
            .execute();
          return nodes.reduce(
            (n, node) => n + ((node.spec as { devices?: unknown[] }).devices ?? []).length,
            0,
          );
        },
        { timeout: 30_000 },
      )
      .toBe(0);
  });
});

describe('a gang member that does not bind', () => {
  it('is re-placed on its own on the same topology value while the others keep their bookings', async () => {
    // fabric-r: the silent node and sim-0000 schedulable; sim-0001 joins it only after placement.
    await label([silent, sim[0]!, sim[1]!], 'fabric-r');
    await cordon(sim[1]!, true);
    const created = await h.compute.api.reservations.create(cred(), gang(2, 8, 'gang-replace'));
    expect(created.state).toBe('placed');
    expect(new Set(created.allocations.map((a) => a.nodeId))).toEqual(new Set([silent, sim[0]!]));
    const kept = created.allocations.find((a) => a.nodeId === sim[0])!;
    const stuck = created.allocations.find((a) => a.nodeId === silent)!;
    await cordon(sim[1]!, false);

    await waitForState(h, created.id, 'active', 60_000);
    const members = await currentAllocations(created.id);
    expect(members.map((m) => [m.node_id, m.gang_index, m.member_attempt])).toEqual(
      [
        [sim[0]!, kept.gangIndex, 0],
        [sim[1]!, stuck.gangIndex, 1],
      ].sort((a, b) => Number(a[1]) - Number(b[1])),
    );
    // The member that stayed kept its allocation (and booking) all along.
    expect(members.find((m) => m.node_id === sim[0])!.id).toBe(kept.id);
    const old = await h.db
      .selectFrom('allocations')
      .where('id', '=', stuck.id)
      .select(['state', 'superseded_at'])
      .executeTakeFirstOrThrow();
    expect(old.state).toBe('failed');
    expect(old.superseded_at).not.toBeNull();
    const types = await eventTypes(h, created.id);
    expect(types).toContain('reservation.member-replaced');
    expect(types).not.toContain('reservation.pending');
    const view = await get(created.id);
    expect(view.gang?.topologyValue).toBe('fabric-r');

    await h.compute.api.reservations.release(cred(), { tenantId: 'acme', reservationId: created.id });
    await waitForState(h, created.id, 'released');
  });

  it('with no node left, sends the whole gang back to pending, every booking released at once', async () => {
    // fabric-q: the silent node and sim-0002 only; fabric-b (6 nodes) keeps its spares whole.
    await label([silent, sim[2]!], 'fabric-q');
    await label([sim[0]!, sim[1]!], 'fabric-b');
    const created = await h.compute.api.reservations.create(cred(), gang(2, 8, 'gang-no-node'));
    expect(created.state).toBe('placed');
    expect(new Set(created.allocations.map((a) => a.nodeId))).toEqual(new Set([silent, sim[2]!]));
    await expect
      .poll(() => eventTypes(h, created.id), { timeout: 60_000, interval: 250 })
      .toContain('reservation.pending');
    const pendingEvent = await h.db
      .selectFrom('outbox_events')
      .where('subject', '=', `reservation/${created.id}`)
      .where('type', '=', 'reservation.pending')
      .select('data')
      .orderBy('seq')
      .executeTakeFirstOrThrow();
    const data = pendingEvent.data as { reason: string; message: string; releasedAllocations: string[] };
    expect(data.message).toContain('no node is left in fabric.domain=fabric-q for gang member');
    // Both members' bookings were released in the one transaction that made it pending.
    expect(new Set(data.releasedAllocations)).toEqual(new Set(created.allocations.map((a) => a.id)));
    await h.compute.api.reservations
      .cancel(cred(), { tenantId: 'acme', reservationId: created.id })
      .catch(() => {});
    await h.compute.api.reservations
      .release(cred(), { tenantId: 'acme', reservationId: created.id })
      .catch(() => {});
    await waitForState(h, created.id, ['cancelled', 'released', 'failed'], 60_000);
  });
});
