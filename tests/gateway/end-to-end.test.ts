import { existsSync, readFileSync } from 'node:fs';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { SimulatedFleet } from '../../daemon/sim.ts';
import type { StartedGateway } from '../../gateway/server.ts';
import { insertPlacedReservation, useLifecycleHarness, waitForState } from '../lifecycle/harness.ts';
import { eventually } from '../support/eventually.ts';
import { joinSimulatedFleet, startTestGateway } from '../support/gateway.ts';
import { useTempDir } from '../support/temp-dir.ts';

/**
 * The whole path with nothing stood in: a bcd agent joins with a token through a real gateway
 * (mutual TLS), a reservation's lifecycle runs on the real Temporal dev server, the node writes the
 * CDI spec and env file for exactly the booked GPUs and signs its report, the worker verifies it
 * and the reservation becomes active; releasing removes the files.
 */
describe('end to end: bcd, gateway and the reservation lifecycle', () => {
  const h = useLifecycleHarness({ name: 'bcd-e2e', nodes: 0, timers: { bindTimeoutMs: 30_000 } });
  const dir = useTempDir('bc-e2e-');
  let gateway: StartedGateway;
  let fleet: SimulatedFleet;
  beforeAll(async () => {
    gateway = await startTestGateway({ db: h.db, lifecycle: h.lifecycle });
    fleet = await joinSimulatedFleet(gateway, h.db, h.poolId, {
      nodes: 1,
      rootDir: dir,
      shape: { gpus: 4, nvlinkDomainSize: 4 },
    });
  });
  afterAll(async () => {
    await fleet?.stop();
    await gateway?.stop();
  });

  it('a joined node binds a reservation (active), and releasing removes its CDI spec and env file', async () => {
    const sim = fleet.nodes[0]!;
    await eventually(async () => {
      const n = await h.db
        .selectFrom('nodes')
        .select('provision_state')
        .where('id', '=', sim.nodeId)
        .executeTakeFirst();
      return n?.provision_state === 'ready';
    });
    const devices = await h.db
      .selectFrom('devices')
      .select(['id', 'stable_id'])
      .where('node_id', '=', sim.nodeId)
      .orderBy('stable_id')
      .execute();
    const node = { id: sim.nodeId, name: sim.name, deviceIds: devices.map((d) => d.id) };
    const { id, allocationId } = await insertPlacedReservation(h, { node });
    await h.lifecycle.start({ id, tenantId: h.tenantId, poolId: h.poolId, state: 'placed' });
    await waitForState(h, id, 'active', 30_000);

    const cdiFile = path.join(sim.dir, 'cdi', `bcd-${allocationId}.json`);
    const envFile = path.join(sim.dir, 'allocations', `${allocationId}.env`);
    const cdi = JSON.parse(readFileSync(cdiFile, 'utf8'));
    const uuids = devices.map((d) => d.stable_id).sort();
    expect(cdi.devices.map((d: { name: string }) => d.name).sort()).toEqual(uuids);
    expect(readFileSync(envFile, 'utf8')).toContain(`BCD_ALLOCATION_ID=${allocationId}`);
    const allocation = await h.db
      .selectFrom('allocations')
      .selectAll()
      .where('id', '=', allocationId)
      .executeTakeFirstOrThrow();
    expect(allocation).toMatchObject({ state: 'bound', attested: true });
    expect((allocation.binding as { cdiDevices: string[] }).cdiDevices.sort()).toEqual(
      uuids.map((u) => `bcd.dev/gpu=${u}`),
    );

    await h.lifecycle.signal(id, { type: 'release' });
    await waitForState(h, id, 'released', 30_000);
    await eventually(async () => !existsSync(cdiFile) && !existsSync(envFile));
  }, 90_000);
});
