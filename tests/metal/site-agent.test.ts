import { createServer, type Server } from 'node:net';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { SimHardware } from '../../daemon/hardware.ts';
import { type RedfishEmulator, startRedfishEmulator } from '../../daemon/redfish-emulator.ts';
import { type StartedSiteAgent, startSiteAgent } from '../../daemon/site-agent.ts';
import { completeSiteAgentCommand } from '../../db/metal/site-leases.ts';
import { enqueueNodeCommand } from '../../db/nodes/commands.ts';
import { isSealed } from '../../domain/sealing.ts';
import type { StartedGateway } from '../../gateway/server.ts';
import { refuseStaleSiteResult } from '../../gateway/site-agents.ts';
import { defaultToolsDir } from '../../temporal/dev-server.ts';
import { type ApiFixture, createApiFixture } from '../support/api.ts';
import { eventually } from '../support/eventually.ts';
import { startTestGateway } from '../support/gateway.ts';
import { testLogger } from '../support/logger.ts';
import { useTempDir } from '../support/temp-dir.ts';

/**
 * Sites and the site agent over a real gateway (mutual TLS), a real database and the real Redfish
 * emulator of sushy-tools (installed into the tools cache's venv from PyPI): a site token joins
 * `bcd site` agents, one holds `site:<id>:boot` and runs every BMC command, a standby takes over
 * under a new epoch only after the lease expires, and the stale agent's writes are refused.
 */
describe('sites, the site agent and BMCs over Redfish', () => {
  const dir = useTempDir('bc-metal-');
  const log = testLogger('metal-test');
  // As the other metal tests: a shorter lease lapses on a busy machine (a full suite beside it),
  // and the boot lease then moves between the agents in the middle of a test.
  const leaseMs = 10_000;
  let api: ApiFixture;
  let gateway: StartedGateway;
  let emulator: RedfishEmulator;
  let silentBmc: Server;
  let silentBmcAddress: string;
  const agents: StartedSiteAgent[] = [];
  let siteId: string;
  let poolId: string;
  let siteToken: string;
  const machines: string[] = [];

  const root = () => api.root.token;
  const call = async (method: string, body: unknown) => {
    const answer = await api.call(root(), method, body);
    if (answer.status !== 200) throw new Error(`${method}: ${answer.status} ${JSON.stringify(answer.body)}`);
    return answer.body.data ?? answer.body;
  };
  // A BMC command answers once it ends or its wait runs out; on a loaded machine the site agent and
  // the Redfish emulator may take longer than one wait, so ask again (the bmc.* kinds are retry-safe).
  const bmc = async (method: string, body: Record<string, unknown>) => {
    for (let attempt = 1; ; attempt++) {
      const answer = await call(method, { ...body, waitSeconds: 120 });
      if (!['queued', 'delivered', 'running'].includes(answer.state) || attempt === 3) return answer;
    }
  };
  const startAgent = (name: string) =>
    startSiteAgent({
      gatewayAddress: gateway.address,
      caCertificatePem: gateway.caCertificatePem,
      token: siteToken,
      dir: path.join(dir, name),
      name,
      hardware: new SimHardware(`${dir}/${name}`, {
        gpus: 0,
        gpuModel: 'none',
        gpuMemoryMiB: 0,
        nvlinkDomainSize: 1,
        numaNodes: 1,
        vcpu: 8,
        memoryGiB: 16,
        hugepages1Gi: 0,
      }),
      log,
      redfish: { requestTimeoutMs: 2_000, powerTimeoutMs: 30_000 },
      minBackoffMs: 100,
      maxBackoffMs: 500,
    });
  const lease = async () => (await call('sites/get', { siteId })).bootLease;

  beforeAll(async () => {
    api = await createApiFixture();
    gateway = await startTestGateway({
      db: api.database.db,
      options: { leaseMs, heartbeatIntervalMs: 500 },
    });
    emulator = await startRedfishEmulator({
      toolsDir: process.env.BETTER_COMPUTE_TOOLS_DIR ?? defaultToolsDir(),
      dataDir: path.join(dir, 'bmc'),
      systems: [
        { uuid: '0b7c8a55-0000-4000-8000-000000000001', name: 'metal-1', macs: ['52:54:00:00:00:01'] },
        { uuid: '0b7c8a55-0000-4000-8000-000000000002', name: 'metal-2', macs: ['52:54:00:00:00:02'] },
      ],
      username: 'bmc-admin',
      password: 'bmc-secret-p4ss',
      log,
    });
    // A BMC that accepts connections and never answers.
    silentBmc = createServer(() => {});
    await new Promise<void>((resolve) => silentBmc.listen(0, '127.0.0.1', resolve));
    silentBmcAddress = `http://127.0.0.1:${(silentBmc.address() as { port: number }).port}`;
  }, 600_000);

  afterAll(async () => {
    for (const agent of agents) await agent.stop();
    await gateway?.stop();
    await emulator?.stop();
    silentBmc?.close();
    await api?.stop();
  });

  it('sites.create, a pool, and a site token (shown once) that joins two site agents of role site', async () => {
    siteId = (await call('sites/create', { name: 'metal-dc', region: 'eu-west-1' })).id;
    poolId = (await call('admin/createPool', { siteId, name: 'metal-pool', gpuModel: 'h100' })).id;
    const token = await call('sites/createToken', { siteId, maxUses: 2 });
    expect(token.token).toMatch(/^bcst_/);
    expect(token.command).toContain('bcd site --token');
    siteToken = token.token;
    agents.push(await startAgent('site-a'));
    await eventually(async () => (await lease())?.holderNodeId === agents[0]!.identity.nodeId);
    agents.push(await startAgent('site-b'));
    const site = await call('sites/get', { siteId });
    expect(site.bootLease).toMatchObject({ name: `site:${siteId}:boot`, epoch: 1 });
    const roles = Object.fromEntries(
      site.agents.map((a: { name: string; role: string }) => [a.name, a.role]),
    );
    expect(roles).toEqual({ 'site-a': 'boot-server', 'site-b': 'standby' });
    const certs = await api.database.db
      .selectFrom('node_certificates')
      .where(
        'node_id',
        'in',
        agents.map((a) => a.identity.nodeId),
      )
      .select('role')
      .execute();
    expect(certs.map((c) => c.role)).toEqual(['site', 'site']);
    // The token allowed two agents: a third join is refused.
    await expect(startAgent('site-c')).rejects.toThrow(/invalid, expired, revoked or used up/);
  });

  it('metal.enroll stores the BMC password sealed and never shows it; a machine powers on through the boot server over Redfish', async () => {
    for (const [i, name] of ['metal-1', 'metal-2'].entries()) {
      const enrolled = await call('metal/enroll', {
        siteId,
        poolId,
        name,
        bmc: {
          address: emulator.address,
          systemId: emulator.systems[i]!.uuid,
          username: emulator.username,
          password: emulator.password,
        },
        inspect: false,
      });
      expect(enrolled.provisionState).toBe('enrolling');
      expect(JSON.stringify(enrolled)).not.toContain(emulator.password);
      machines.push(enrolled.nodeId);
    }
    const stored = await api.database.db.selectFrom('bmc_endpoints').select('password_sealed').execute();
    expect(stored.every((row) => isSealed(row.password_sealed))).toBe(true);

    const inventory = await bmc('metal/inventory', { nodeId: machines[0] });
    expect(inventory).toMatchObject({
      state: 'succeeded',
      leaseEpoch: 1,
      siteAgentNodeId: agents[0]!.identity.nodeId,
    });
    expect(inventory.system).toMatchObject({
      name: 'metal-1',
      powerState: 'off',
      macs: ['52:54:00:00:00:01'],
    });

    const boot = await bmc('metal/bootDevice', { nodeId: machines[0], device: 'pxe' });
    expect(boot.system.bootDevice).toBe('pxe');
    const on = await bmc('metal/power', { nodeId: machines[0], action: 'on' });
    expect(on).toMatchObject({ state: 'succeeded', system: { powerState: 'on', redfishPowerState: 'On' } });
    const machine = await call('metal/getMachine', { nodeId: machines[0] });
    expect(machine.bmc).toMatchObject({ powerState: 'on', bootDevice: 'pxe', lastError: null });
    const node = await api.database.db
      .selectFrom('nodes')
      .select('power_state')
      .where('id', '=', machines[0]!)
      .executeTakeFirstOrThrow();
    expect(node.power_state).toBe('on');

    // The password crosses only the mutual-TLS stream: no command row, no API answer holds it.
    const rows = await api.database.db.selectFrom('node_commands').select(['payload', 'result']).execute();
    expect(JSON.stringify(rows)).not.toContain(emulator.password);
    const listed = await call('metal/machines', { siteId });
    expect(JSON.stringify(listed)).not.toContain(emulator.password);
  }, 120_000);

  it('nodes.command refuses the bmc.* kinds (the control plane queues them) and kinds whose role is not the node’s', async () => {
    const site = agents[0]!.identity.nodeId;
    const byHand = await api.call(root(), 'nodes/command', {
      nodeId: site,
      kind: 'bmc.power',
      payload: { action: 'on' },
    });
    expect(byHand.status).toBe(400);
    expect(byHand.body.error.code).toBe('INVALID_INPUT');
    // The data access refuses it too, whoever calls it without being the control plane.
    const direct = api.database.db.transaction().execute((trx) =>
      enqueueNodeCommand(trx, {
        nodeId: site,
        kind: 'bmc.inventory',
        payload: {
          machineNodeId: machines[0],
          leaseEpoch: 1,
          bmc: { address: 'http://10.0.0.1', systemId: '1', username: 'root', credential: 'calvin' },
        },
      }),
    );
    await expect(direct).rejects.toMatchObject({
      code: 'INVALID_INPUT',
      message: expect.stringMatching(/queued only by the control plane/),
    });
    // A GPU kind on the site agent, and a site kind's role on a bare machine: INVALID_STATE.
    const gpuOnSite = await api.call(root(), 'nodes/command', {
      nodeId: site,
      kind: 'diag.nvml',
      payload: { level: 'quick' },
    });
    expect(gpuOnSite.status).toBe(409);
    expect(gpuOnSite.body.error).toMatchObject({
      code: 'INVALID_STATE',
      message: expect.stringMatching(
        /has role site; diag.nvml runs only on a node of role node or node-tenant/,
      ),
    });
    // Nothing was written: every bmc.* command of the agent is one the metal API queued.
    const written = await api.database.db
      .selectFrom('node_commands')
      .where('node_id', '=', site)
      .select(['kind', 'payload'])
      .execute();
    expect(written.filter((c) => c.kind === 'diag.nvml')).toEqual([]);
    expect(written.filter((c) => c.kind.startsWith('bmc.')).every((c) => c.payload.leaseEpoch === 1)).toBe(
      true,
    );
    expect(JSON.stringify(written)).not.toContain('calvin');
  });

  it('a BMC that refuses the credentials, or stops answering, fails the command with the reason', async () => {
    const wrong = await call('metal/enroll', {
      siteId,
      poolId,
      name: 'wrong-password',
      bmc: { address: emulator.address, systemId: 'metal-9', username: 'bmc-admin', password: 'not-it' },
      inspect: false,
    });
    const refused = await bmc('metal/inventory', { nodeId: wrong.nodeId });
    expect(refused.state).toBe('failed');
    expect(refused.error).toMatch(/the BMC refused the credentials/);
    expect(refused.error).not.toContain('not-it');
    const silent = await call('metal/enroll', {
      siteId,
      poolId,
      name: 'silent',
      bmc: { address: silentBmcAddress, systemId: '1', username: 'root', password: 'calvin' },
      inspect: false,
    });
    const answer = await bmc('metal/power', { nodeId: silent.nodeId, action: 'on' });
    expect(answer.state).toBe('failed');
    expect(answer.error).toMatch(/did not answer .* within 2000 ms/);
    const machine = await call('metal/getMachine', { nodeId: silent.nodeId });
    expect(machine.bmc.lastError).toMatch(/did not answer/);
  }, 60_000);

  it('the boot server drives different machines’ BMCs side by side, each machine’s commands in order', async () => {
    const silent = await call('metal/enroll', {
      siteId,
      poolId,
      name: 'silent-in-order',
      bmc: { address: silentBmcAddress, systemId: '2', username: 'root', password: 'calvin' },
      inspect: false,
    });
    // Four commands to a BMC that never answers: each fails after its 2 s request deadline...
    const stuck: string[] = [];
    for (const [method, body] of [
      ['metal/power', { action: 'on' }],
      ['metal/inventory', {}],
      ['metal/bootDevice', { device: 'disk' }],
      ['metal/power', { action: 'off' }],
    ] as const) {
      stuck.push((await call(method, { nodeId: silent.nodeId, ...body, waitSeconds: 0 })).commandId);
    }
    // ...and one to a BMC that answers, sent after them: it does not wait behind them.
    const inventory = await bmc('metal/inventory', { nodeId: machines[1] });
    expect(inventory).toMatchObject({ state: 'succeeded', system: { name: 'metal-2' } });
    const rows = async () =>
      api.database.db
        .selectFrom('node_commands')
        .where('id', 'in', [...stuck, inventory.commandId])
        .select(['id', 'state', 'delivered_at', 'completed_at'])
        .execute();
    await eventually(async () => (await rows()).every((r) => r.completed_at !== null), 60_000);
    const byId = new Map((await rows()).map((r) => [r.id, r]));
    const done = stuck.map((id) => byId.get(id)!);
    expect(done.map((r) => r.state)).toEqual(['failed', 'failed', 'failed', 'failed']);
    // One machine's commands ran one after another, in the order they were sent (2 s each): they
    // completed in that order, and the last no sooner than four deadlines after the first was
    // delivered (results recorded late on a busy machine can only widen that span).
    const completed = done.map((r) => r.completed_at!.getTime());
    expect(completed).toEqual([...completed].sort((a, b) => a - b));
    expect(completed[completed.length - 1]! - done[0]!.delivered_at!.getTime()).toBeGreaterThan(
      4 * 2_000 - 500,
    );
    expect(byId.get(inventory.commandId)!.completed_at!.getTime()).toBeLessThan(
      done[done.length - 1]!.completed_at!.getTime(),
    );
  }, 120_000);

  it('the standby takes over only after the lease expires, under epoch 2; the stale agent’s writes are refused', async () => {
    const [a, b] = agents as [StartedSiteAgent, StartedSiteAgent];
    const db = api.database.db;
    // A stale write to check later: a bmc command sent to A under epoch 1, delivered, unanswered.
    const before = await lease();
    expect(before).toMatchObject({ holderNodeId: a.identity.nodeId, epoch: 1 });
    a.agent.silence(true);
    // Not before the lease expired: B stays standby for at least the rest of A's lease.
    const stillA = await lease();
    expect(stillA.holderNodeId).toBe(a.identity.nodeId);
    await eventually(async () => (await lease())?.holderNodeId === b.identity.nodeId, 30_000);
    const after = await lease();
    expect(after.epoch).toBe(2);
    expect(after.acquiredAt).toBeGreaterThanOrEqual(before.expiresAt);

    // Commands go to B now, under epoch 2.
    const inventory = await bmc('metal/inventory', { nodeId: machines[1] });
    expect(inventory).toMatchObject({
      state: 'succeeded',
      leaseEpoch: 2,
      siteAgentNodeId: b.identity.nodeId,
    });

    // A's write under epoch 1 changes nothing and is refused with both epochs named.
    const stale = await db
      .selectFrom('node_commands')
      .where('node_id', '=', a.identity.nodeId)
      .where('kind', 'like', 'bmc.%')
      .select(['id', 'seq'])
      .orderBy('seq', 'desc')
      .executeTakeFirstOrThrow();
    await db
      .updateTable('node_commands')
      .set({ state: 'delivered', completed_at: null })
      .where('id', '=', stale.id)
      .execute();
    const epoch = Number(
      (
        await db
          .selectFrom('nodes')
          .select('epoch')
          .where('id', '=', a.identity.nodeId)
          .executeTakeFirstOrThrow()
      ).epoch,
    );
    const stored = await completeSiteAgentCommand(db, {
      nodeId: a.identity.nodeId,
      epoch,
      commandId: stale.id,
      seq: Number(stale.seq),
      state: 'succeeded',
      result: { forged: true },
      error: null,
    });
    expect(stored).toBeNull();
    await expect(
      refuseStaleSiteResult(db, { nodeId: a.identity.nodeId, siteId }, stale.id),
    ).rejects.toMatchObject({
      code: 'INVALID_STATE',
      message: expect.stringMatching(/epoch 1, the lease is now at epoch 2/),
    });

    // A comes back: it stays a standby while B renews.
    a.agent.silence(false);
    const site = await call('sites/get', { siteId });
    expect(site.bootLease).toMatchObject({ holderNodeId: b.identity.nodeId, epoch: 2 });
  }, 90_000);
});
