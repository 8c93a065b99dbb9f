import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { NodeAgent } from '../../daemon/agent.ts';
import { SimHardware } from '../../daemon/hardware.ts';
import { joinWithToken, loadIdentity } from '../../daemon/identity.ts';
import { type SimulatedFleet, startSimulatedFleet } from '../../daemon/sim.ts';
import type { StartedGateway } from '../../gateway/server.ts';
import { useAdmissionHarness } from '../admission/harness.ts';
import { insertBareAllocation } from '../support/allocations.ts';
import { eventually } from '../support/eventually.ts';
import { gatewayTestLog, startTestGateway } from '../support/gateway.ts';
import { useTempDir } from '../support/temp-dir.ts';

describe('the nodes and joinTokens API groups', () => {
  const h = useAdmissionHarness();
  const dir = useTempDir('bc-nodes-api-');
  let gateway: StartedGateway;
  let fleet: SimulatedFleet | undefined;
  let poolId: string;
  beforeAll(async () => {
    gateway = await startTestGateway({
      db: h.t.db,
      log: h.deps.log,
      lifecycle: h.deps.lifecycle,
      options: { certificateCheckMs: 500 },
    });
    const site = await h.call(h.rootToken, 'admin/createSite', { name: 'dc-1', region: 'eu-1' });
    const pool = await h.call(h.rootToken, 'admin/createPool', {
      siteId: site.body.data.id,
      name: 'h100',
      gpuModel: 'h100',
    });
    poolId = pool.body.data.id;
  });
  afterAll(async () => {
    await fleet?.stop();
    await gateway?.stop();
  });

  it('creates a join token shown once, a node joins with it, and the operator lists, cordons, drains and uncordons it', async () => {
    const created = await h.call(h.rootToken, 'joinTokens/create', { poolId, ttlSeconds: 600, maxUses: 1 });
    expect(created.status).toBe(200);
    expect(created.body.data).toMatchObject({ poolId, maxUses: 1, uses: 0, state: 'active' });
    expect(created.body.data.token).toMatch(/^bcjt_[0-9a-z]{26}\.[A-Za-z0-9_-]{43}$/);
    expect(created.body.data.caCertificatePem).toBe(gateway.caCertificatePem);
    expect(created.body.data.command).toContain(`bcd join --token ${created.body.data.token} --gateway `);
    const listed = await h.call(h.rootToken, 'joinTokens/list', { poolId });
    expect(listed.body.data.tokens).toHaveLength(1);
    expect(JSON.stringify(listed.body)).not.toContain(created.body.data.token.split('.')[1]);

    fleet = await startSimulatedFleet({
      gatewayAddress: gateway.address,
      caCertificatePem: gateway.caCertificatePem,
      joinToken: created.body.data.token,
      nodes: 1,
      rootDir: dir,
      log: gatewayTestLog,
    });
    const nodeId = fleet.nodes[0]!.nodeId;
    const ready = await eventually(async () => {
      const got = await h.call(h.rootToken, 'nodes/get', { nodeId });
      return got.body.data?.provisionState === 'ready' ? got.body.data : null;
    });
    expect(ready).toMatchObject({ connectivity: 'connected', gpuCount: 8, cordoned: false, poolId });
    expect(ready.devices).toHaveLength(8);
    expect(ready.labels).toContainEqual({
      key: 'bc.dev/cap.devices.limits',
      value: 'true',
      source: 'system',
    });
    expect(ready.certificateNotAfter).toBeGreaterThan(Date.now());

    const used = await h.call(h.rootToken, 'joinTokens/list', { poolId });
    expect(used.body.data.tokens[0]).toMatchObject({ uses: 1, state: 'used' });

    const list = await h.call(h.rootToken, 'nodes/list', { poolId });
    expect(list.body.data.nodes.map((n: { id: string }) => n.id)).toEqual([nodeId]);

    const cordoned = await h.call(h.rootToken, 'nodes/cordon', { nodeId, reason: 'disk swap' });
    expect(cordoned.body.data.node).toMatchObject({
      cordoned: true,
      cordonReason: 'disk swap',
      draining: false,
    });
    const drained = await h.call(h.rootToken, 'nodes/drain', { nodeId });
    expect(drained.body.data).toMatchObject({
      node: { cordoned: true, draining: true, drained: true },
      liveAllocations: 0,
    });
    expect(drained.body.data.node.conditions.map((c: { type: string }) => c.type)).toContain('Draining');
    const uncordoned = await h.call(h.rootToken, 'nodes/uncordon', { nodeId });
    expect(uncordoned.body.data.node).toMatchObject({ cordoned: false, draining: false, conditions: [] });
    const sent = await h.call(h.rootToken, 'nodes/command', {
      nodeId,
      kind: 'diag.nvml',
      payload: { level: 'quick' },
    });
    expect(sent.body.data).toMatchObject({ kind: 'diag.nvml', lane: 'bulk', state: 'queued', seq: 1 });
    const done = await eventually(async () => {
      const got = await h.call(h.rootToken, 'nodes/getCommand', { nodeId, commandId: sent.body.data.id });
      return got.body.data?.state === 'succeeded' ? got.body.data : null;
    });
    expect(done.result.gpus).toHaveLength(8);
    const listedCommands = await h.call(h.rootToken, 'nodes/listCommands', { nodeId });
    expect(listedCommands.body.data.commands.map((c: { id: string }) => c.id)).toEqual([sent.body.data.id]);
    const badKind = await h.call(h.rootToken, 'nodes/command', { nodeId, kind: 'rm.rf' });
    expect(badKind.body.error.code).toBe('INVALID_INPUT');
    const badPayload = await h.call(h.rootToken, 'nodes/command', { nodeId, kind: 'gpu.reset', payload: {} });
    expect(badPayload.body.error.code).toBe('INVALID_INPUT');

    const events = await h.t.db
      .selectFrom('outbox_events')
      .select('type')
      .where('subject', '=', `node/${nodeId}`)
      .execute();
    expect(events.map((e) => e.type)).toEqual([
      'node.cordoned',
      'node.draining',
      // Nothing runs on it, so the drain finishes at once.
      'node.drained',
      'node.uncordoned',
      'node.command-queued',
    ]);
  });

  it('refuses bad input, strangers and revoked tokens, and changes nothing', async () => {
    const bad = await h.call(h.rootToken, 'nodes/cordon', { nodeId: 'nope' });
    expect(bad.body.error.code).toBe('INVALID_INPUT');
    const extra = await h.call(h.rootToken, 'joinTokens/create', { poolId, ttlSeconds: 600, surprise: 1 });
    expect(extra.body.error.code).toBe('INVALID_INPUT');
    const missing = await h.call(h.rootToken, 'nodes/get', { nodeId: 'node_00000000000000000000000000' });
    expect(missing.body.error.code).toBe('NOT_FOUND');

    await h.call(h.rootToken, 'admin/createTenant', { id: 'acme', name: 'Acme' });
    const person = await h.call(h.rootToken, 'admin/createIdentity', {
      tenantId: 'acme',
      kind: 'person',
      name: 'ann',
      roles: ['member'],
    });
    const token = (await h.call(h.rootToken, 'admin/createToken', { identityId: person.body.data.id })).body
      .data.token;
    const nodeId = fleet!.nodes[0]!.nodeId;
    const stranger = await h.call(token, 'nodes/cordon', { nodeId });
    expect(stranger.body.error.code).toBe('NOT_FOUND');
    const strangerToken = await h.call(token, 'joinTokens/create', { poolId });
    expect(strangerToken.body.error.code).toBe('NOT_FOUND');
    const node = await h.call(h.rootToken, 'nodes/get', { nodeId });
    expect(node.body.data.cordoned).toBe(false);

    const created = await h.call(h.rootToken, 'joinTokens/create', { poolId, ttlSeconds: 600 });
    const revoked = await h.call(h.rootToken, 'joinTokens/revoke', { tokenId: created.body.data.id });
    expect(revoked.body.data.state).toBe('revoked');
    await expect(
      joinWithToken({
        gateway: gateway.address,
        token: created.body.data.token,
        caCertificatePem: gateway.caCertificatePem,
        dir: path.join(dir, 'late'),
        evidence: new SimHardware('late').evidence(),
        requestedName: 'late',
        agentVersion: 'test',
      }),
    ).rejects.toMatchObject({ code: 16 });
  });
  it('revokes certificates, approves a reclaim and retires a node over HTTP; other tenants change nothing', async () => {
    const node = fleet!.nodes[0]!;
    const nodeId = node.nodeId;
    const db = h.t.db;
    const certs = () =>
      db
        .selectFrom('node_certificates')
        .select(['serial', 'revoked_at', 'revoke_reason'])
        .where('node_id', '=', nodeId)
        .orderBy('created_at')
        .execute();

    // An administrator of another tenant sees nothing of the node and changes nothing.
    await h.call(h.rootToken, 'admin/createTenant', { id: 'globex', name: 'Globex' });
    const admin = await h.call(h.rootToken, 'admin/createIdentity', {
      tenantId: 'globex',
      kind: 'person',
      name: 'gus',
      roles: ['admin'],
    });
    const stranger = (await h.call(h.rootToken, 'admin/createToken', { identityId: admin.body.data.id })).body
      .data.token;
    for (const [method, input] of [
      ['nodes/revokeCertificates', { nodeId }],
      ['nodes/approveReclaim', { nodeId }],
      ['nodes/retire', { nodeId, force: true }],
    ] as const) {
      expect((await h.call(stranger, method, input)).body.error.code).toBe('NOT_FOUND');
    }
    expect((await certs()).every((c) => c.revoked_at === null)).toBe(true);
    const bad = await h.call(h.rootToken, 'nodes/approveReclaim', { nodeId, ttlSeconds: 1 });
    expect(bad.body.error.code).toBe('INVALID_INPUT');

    // Revoking: the live session ends at the gateway's next certificate check.
    expect(node.agent.status.connected).toBe(true);
    const revoked = await h.call(h.rootToken, 'nodes/revokeCertificates', { nodeId, reason: 'stolen disk' });
    expect(revoked.status).toBe(200);
    expect(revoked.body.data.revokedCertificates).toBeGreaterThanOrEqual(1);
    await eventually(async () => !node.agent.status.connected, 30_000);
    expect((await certs()).every((c) => c.revoke_reason === 'revoked')).toBe(true);
    await node.agent.stop();

    // The machine keeps its key, but its certificates are revoked: only an approval gives it its
    // node back.
    const approved = await h.call(h.rootToken, 'nodes/approveReclaim', { nodeId, ttlSeconds: 600 });
    expect(approved.body.data.reclaimApprovedUntil).toBeGreaterThan(Date.now());
    const token = (await h.call(h.rootToken, 'joinTokens/create', { poolId, ttlSeconds: 600, maxUses: 2 }))
      .body.data.token;
    const back = await joinWithToken({
      gateway: gateway.address,
      token,
      caCertificatePem: gateway.caCertificatePem,
      dir: node.dir,
      evidence: node.hardware.evidence(),
      requestedName: 'back',
      agentVersion: 'test',
    });
    expect(back).toMatchObject({ nodeId, reclaimed: true });
    const agent = new NodeAgent({
      identity: loadIdentity(node.dir),
      stateDir: node.dir,
      roots: { cdiDir: path.join(node.dir, 'cdi'), envDir: path.join(node.dir, 'allocations') },
      hardware: node.hardware,
      log: gatewayTestLog,
      minBackoffMs: 100,
      maxBackoffMs: 500,
    });
    agent.start();
    try {
      await eventually(async () => agent.status.connected);
      // Retiring: refused while a live allocation holds the node, unless forced.
      const start = new Date();
      await db
        .transaction()
        .execute((trx) =>
          insertBareAllocation(trx, { poolId, nodeId, start, end: new Date(start.getTime() + 3600_000) }),
        );
      const held = await h.call(h.rootToken, 'nodes/retire', { nodeId });
      expect(held.body.error).toMatchObject({ code: 'INVALID_STATE', details: { liveAllocations: 1 } });
      expect((await h.call(h.rootToken, 'nodes/get', { nodeId })).body.data.provisionState).not.toBe(
        'retired',
      );
      const retired = await h.call(h.rootToken, 'nodes/retire', {
        nodeId,
        force: true,
        reason: 'decommissioned',
      });
      expect(retired.body.data).toMatchObject({
        changed: true,
        liveAllocations: 1,
        revokedCertificates: 1,
        node: { provisionState: 'retired', cordoned: true, cordonReason: 'decommissioned' },
      });
      await eventually(async () => !agent.status.connected, 30_000);
      const again = await h.call(h.rootToken, 'nodes/retire', { nodeId, force: true });
      expect(again.body.data).toMatchObject({ changed: false, revokedCertificates: 0 });
      expect((await certs()).every((c) => c.revoked_at !== null)).toBe(true);
      const row = await db
        .selectFrom('nodes')
        .select(['hardware_key', 'provision_state'])
        .where('id', '=', nodeId)
        .executeTakeFirstOrThrow();
      expect(row).toEqual({ hardware_key: null, provision_state: 'retired' });
    } finally {
      await agent.stop();
    }
    // Its hardware key is free: the machine joins again as a new node, with no conflict.
    const fresh = await joinWithToken({
      gateway: gateway.address,
      token,
      caCertificatePem: gateway.caCertificatePem,
      dir: path.join(dir, 'after-retirement'),
      evidence: node.hardware.evidence(),
      requestedName: 'reborn',
      agentVersion: 'test',
    });
    expect(fresh.nodeId).not.toBe(nodeId);
    expect(fresh.reclaimed).toBe(false);
    expect(
      await db.selectFrom('node_conditions').select('type').where('node_id', '=', fresh.nodeId).execute(),
    ).toEqual([]);
    const audit = await db
      .selectFrom('audit_events')
      .select('action')
      .where('resource_id', '=', nodeId)
      .where('action', 'in', [
        'compute:nodes:retire',
        'compute:nodes:revoke-certificates',
        'compute:nodes:approve-reclaim',
      ])
      .orderBy('id')
      .execute();
    expect(audit.map((a) => a.action)).toEqual([
      'compute:nodes:revoke-certificates',
      'compute:nodes:approve-reclaim',
      'compute:nodes:retire',
    ]);
  });
});
