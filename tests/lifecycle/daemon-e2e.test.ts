import { randomBytes } from 'node:crypto';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, inject, it } from 'vitest';
import { parseConfig } from '../../core/config.ts';
import { createLogger } from '../../core/logger.ts';
import { type SimulatedFleet, startSimulatedFleet } from '../../daemon/sim.ts';
import { insertPool, insertSite, offerPool } from '../../db/nodes/fleet.ts';
import { createJoinToken } from '../../db/nodes/join-tokens.ts';
import { type StartedGateway, startGateway } from '../../gateway/server.ts';
import { bootstrapPlatform } from '../../iam/bootstrap.ts';
import { createEmbeddedIam } from '../../iam/embedded/index.ts';
import { createCompute } from '../../server/compute.ts';
import { connectTemporal, type TemporalClientHandle } from '../../temporal/client.ts';
import { createTemporalLifecycle } from '../../temporal/lifecycle.ts';
import { type RunningWorker, startWorker } from '../../temporal/worker.ts';
import { createTestDatabase, type TestDatabase } from '../support/database.ts';
import { fastTimers } from './harness.ts';

/**
 * The whole path with real parts: the reservations API, the lifecycle on Temporal, the gateway with
 * mutual TLS, and a simulated bcd that joins, receives its NodeSpec, binds and signs its reports.
 */
let t: TestDatabase;
let temporal: TemporalClientHandle;
let worker: RunningWorker;
let gateway: StartedGateway;
let fleet: SimulatedFleet;
let compute: ReturnType<typeof createCompute>;
let credential: { token: string };
let poolId: string;
let dir: string;

beforeAll(async () => {
  t = await createTestDatabase();
  dir = mkdtempSync(path.join(tmpdir(), 'bc-lifecycle-'));
  const log = createLogger({ level: 'silent', name: 'daemon-e2e' });
  const config = parseConfig({});
  const iam = createEmbeddedIam({ db: t.db, log });
  await bootstrapPlatform(iam);
  await iam.admin.createTenant({ id: 'acme', name: 'acme' });
  const identity = await iam.admin.createIdentity({ tenantId: 'acme', kind: 'person', name: 'ada' });
  await iam.admin.bindRole({ identityId: identity.id, role: 'member' });
  credential = { token: (await iam.admin.createToken({ identityId: identity.id })).token };
  const siteId = await insertSite(t.db, { name: 'dc-e2e', region: 'eu-central-1' });
  poolId = await insertPool(t.db, { siteId, ownerTenantId: 'platform', name: 'h100', gpuModel: 'h100' });
  await offerPool(t.db, { poolId, tenantId: 'acme', quota: { gpu: 16 } });

  const address = inject('temporalAddress');
  const taskQueue = `lifecycle-daemon-e2e-${randomBytes(4).toString('hex')}`;
  const timers = { ...fastTimers, bindTimeoutMs: 30_000 };
  temporal = await connectTemporal({ address });
  const lifecycle = createTemporalLifecycle(temporal.client, { taskQueue, timers });
  worker = await startWorker({ db: t.db, log, iam, address, taskQueue, timers, sweeper: false });
  gateway = await startGateway({
    config,
    db: t.db,
    log,
    lifecycle,
    host: '127.0.0.1',
    port: 0,
    options: { deliveryIntervalMs: 50 },
  });
  fleet = await startSimulatedFleet({
    gatewayAddress: gateway.address,
    caCertificatePem: gateway.caCertificatePem,
    joinToken: (await createJoinToken(t.db, { poolId, ttlSeconds: 600, maxUses: 1 })).token,
    nodes: 1,
    rootDir: dir,
    log,
  });
  compute = createCompute({ config, db: t.db, log, iam, lifecycle, temporal: temporal.client });
  for (let i = 0; i < 200; i++) {
    const ready = await t.db
      .selectFrom('nodes as n')
      .where('n.provision_state', '=', 'ready')
      .where((eb) => eb.exists(eb.selectFrom('devices as d').whereRef('d.node_id', '=', 'n.id')))
      .select('n.id')
      .executeTakeFirst();
    if (ready) break;
    await new Promise((r) => setTimeout(r, 100));
  }
});

afterAll(async () => {
  await fleet?.stop();
  await gateway?.stop();
  await worker?.stop();
  await temporal?.close();
  await t?.drop();
  if (dir) rmSync(dir, { recursive: true, force: true });
});

const get = (id: string) => compute.api.reservations.get(credential, { tenantId: 'acme', reservationId: id });

describe('a reservation on a simulated bcd', () => {
  it('is placed, bound by the node (signed report), active with its binding, and released', async () => {
    const created = await compute.api.reservations.create(credential, {
      tenantId: 'acme',
      poolId,
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
    const allocation = await t.db
      .selectFrom('allocations')
      .where('reservation_id', '=', created.id)
      .select(['attested', 'bound_at'])
      .executeTakeFirstOrThrow();
    expect(allocation.attested).toBe(true);

    const released = await compute.api.reservations.release(credential, {
      tenantId: 'acme',
      reservationId: created.id,
    });
    expect(released.state).toBe('released');
    // The node's spec loses the assignment.
    await expect
      .poll(
        async () => {
          const node = await t.db.selectFrom('nodes').select('spec').executeTakeFirstOrThrow();
          return ((node.spec as { devices?: unknown[] }).devices ?? []).length;
        },
        { timeout: 10_000 },
      )
      .toBe(0);
    expect(await temporal.client.workflow.getHandle(created.id).result()).toEqual({ state: 'released' });
  });
});
