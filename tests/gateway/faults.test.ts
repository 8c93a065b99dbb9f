import { Metadata } from '@grpc/grpc-js';
import { describe, expect, it } from 'vitest';
import { NodeAgent } from '../../daemon/agent.ts';
import { gatewayChannel } from '../../daemon/gateway-tls.ts';
import { SimHardware } from '../../daemon/hardware.ts';
import { joinWithToken, loadIdentity } from '../../daemon/identity.ts';
import { advanceComputeClock } from '../../db/clock.ts';
import { revokeNodeCertificates } from '../../db/nodes/certificates.ts';
import { enqueueNodeCommand, findNodeCommand } from '../../db/nodes/commands.ts';
import {
  createCertificateAuthority,
  createCsr,
  generateKeyPairPem,
  issueNodeCertificate,
  readCsr,
} from '../../domain/pki.ts';
import { AgentServiceClient, type ControlMessage } from '../../proto/gen/agent/v1/agent.ts';
import { insertBareAllocation } from '../support/allocations.ts';
import { eventually } from '../support/eventually.ts';
import { gatewayTestLog, useGatewayFixture } from '../support/gateway.ts';

/**
 * Opens a session with a Hello and answers the status it ends with, or 'open' once the gateway
 * welcomes it (an event, not a time: a refusal that came late under load is still a refusal).
 */
async function sessionStatus(
  gateway: string,
  ca: string,
  key: string,
  cert: string,
  nodeId: string,
): Promise<number | 'open'> {
  const tls = gatewayChannel(gateway, { caCertificatePem: ca, privateKeyPem: key, certificatePem: cert });
  const client = new AgentServiceClient(gateway, tls.credentials, tls.options);
  const stream = client.session(new Metadata());
  try {
    return await new Promise((resolve, reject) => {
      stream.on('error', (e: { code: number }) => resolve(e.code));
      stream.on('data', (m: ControlMessage) => {
        if (m.body?.$case === 'welcome') resolve('open');
      });
      stream.on('end', () => reject(new Error('the session ended without a status')));
      stream.write({
        body: {
          $case: 'hello',
          value: {
            nodeId,
            agentVersion: 'raw',
            protocolVersion: 0,
            capabilities: [],
            journalId: 'jrn_sessionstatus',
            lastAckedSeq: 0,
            observedGeneration: 0,
            inventory: [],
          },
        },
      });
    });
  } finally {
    stream.cancel();
    client.close();
  }
}

describe('faults and refusals', () => {
  const fx = useGatewayFixture(
    { leaseMs: 1_500, heartbeatIntervalMs: 250 },
    { nodes: 3, minBackoffMs: 100, maxBackoffMs: 1_000, until: 'connected' },
  );

  it('refuses a used or expired join token', async () => {
    const hardware = new SimHardware('extra-machine');
    const join = (token: string) =>
      joinWithToken({
        gateway: fx.gateway.address,
        token,
        caCertificatePem: fx.gateway.caCertificatePem,
        dir: `${fx.dir}/extra-${Math.random()}`,
        evidence: hardware.evidence(),
        requestedName: 'extra',
        agentVersion: 'test',
      });
    const once = await fx.token(1);
    await join(once);
    await expect(join(once)).rejects.toMatchObject({ code: 16 });
    const expiring = await fx.token(1, 60);
    await advanceComputeClock(fx.database.db, 61_000);
    await expect(join(expiring)).rejects.toMatchObject({ code: 16 });
    await advanceComputeClock(fx.database.db, -61_000);
    // The moved clock made every node look silent to the sweep; their live sessions' next
    // heartbeats connect them again.
    await eventually(async () => {
      const ids = fx.fleet.nodes.map((n) => n.nodeId);
      const rows = await fx.database.db
        .selectFrom('nodes')
        .select('connectivity')
        .where('id', 'in', ids)
        .execute();
      const conditions = await fx.database.db
        .selectFrom('node_conditions')
        .select('type')
        .where('node_id', 'in', ids)
        .execute();
      return rows.every((r) => r.connectivity === 'connected') && conditions.length === 0;
    });
    await expect(join('bcjt_nonsense')).rejects.toMatchObject({ code: 16 });
  });

  it('refuses unknown, foreign and revoked certificates', async () => {
    // A certificate from another CA: the TLS layer does not verify it, the gateway refuses.
    const foreignCa = await createCertificateAuthority('elsewhere');
    const keys = await generateKeyPairPem();
    const csr = await readCsr(await createCsr(keys, 'evil'));
    const forged = await issueNodeCertificate({
      ca: foreignCa,
      publicKeyPem: csr.publicKeyPem,
      spiffeId: `spiffe://better-compute.local/site/${fx.siteId}/node/${fx.fleet.nodes[0]!.nodeId}`,
      nodeName: 'evil',
      role: 'node',
      now: new Date(),
      validForMs: 3600_000,
    });
    const ca = fx.gateway.caCertificatePem;
    expect(
      await sessionStatus(
        fx.gateway.address,
        ca,
        keys.privateKeyPem,
        forged.certificatePem,
        fx.fleet.nodes[0]!.nodeId,
      ),
    ).toBe(16);
    // Revoked: the node's own certificate after revocation.
    // Revoked while its session is live: the session ends, and no new one opens.
    const victim = fx.fleet.nodes[2]!;
    const sessionsBefore = victim.agent.status.sessions;
    expect(victim.agent.status.connected).toBe(true);
    await revokeNodeCertificates(fx.database.db, victim.nodeId);
    await eventually(async () => !victim.agent.status.connected);
    // Absence of an effect: its reconnects (100 ms backoff) are refused meanwhile.
    await new Promise((r) => setTimeout(r, 500));
    expect(victim.agent.status.connected).toBe(false);
    expect(victim.agent.status.sessions).toBe(sessionsBefore);
    await victim.agent.stop();
    const identity = loadIdentity(victim.dir);
    expect(
      await sessionStatus(
        fx.gateway.address,
        ca,
        identity.privateKeyPem,
        identity.certificatePem,
        victim.nodeId,
      ),
    ).toBe(16);
    // A retired node's certificate holds no session (PERMISSION_DENIED); every certificate role
    // holds one since site agents and ramdisks have sessions too.
    const joined = await joinWithToken({
      gateway: fx.gateway.address,
      token: await fx.token(1),
      caCertificatePem: ca,
      dir: `${fx.dir}/retiring`,
      evidence: new SimHardware('retiring').evidence(),
      requestedName: 'retiring',
      agentVersion: 'test',
    });
    const provisionState = (state: 'retired' | 'ready') =>
      fx.database.db
        .updateTable('nodes')
        .set({ provision_state: state })
        .where('id', '=', joined.nodeId)
        .execute();
    await provisionState('retired');
    expect(
      await sessionStatus(fx.gateway.address, ca, joined.privateKeyPem, joined.certificatePem, joined.nodeId),
    ).toBe(7);
    // The same certificate of a node in service opens a session.
    await provisionState('ready');
    expect(
      await sessionStatus(fx.gateway.address, ca, joined.privateKeyPem, joined.certificatePem, joined.nodeId),
    ).toBe('open');
  });

  it('runs commands in order, expires late ones, and a restarted bcd never runs one twice', async () => {
    const db = fx.database.db;
    const node = fx.fleet.nodes[0]!;
    const gpu = node.hardware.gpus().gpus[7]!.uuid;
    const [refresh, diag] = await db.transaction().execute(async (trx) => [
      await enqueueNodeCommand(trx, { nodeId: node.nodeId, kind: 'inventory.refresh' }),
      await enqueueNodeCommand(trx, {
        nodeId: node.nodeId,
        kind: 'diag.nvml',
        payload: { level: 'quick' },
      }),
    ]);
    expect(diag!.seq).toBe(refresh!.seq + 1);
    await eventually(async () => (await findNodeCommand(db, diag!.id))?.state === 'succeeded');
    expect((await findNodeCommand(db, refresh!.id))?.state).toBe('succeeded');
    await expect(
      db.transaction().execute((trx) => enqueueNodeCommand(trx, { nodeId: node.nodeId, kind: 'rm.rf' })),
    ).rejects.toMatchObject({ code: 'INVALID_INPUT' });

    // A reset that hangs: bcd is killed mid-command and started again on the same journal.
    node.hardware.resetDelayMs = 60_000;
    const reset = await db
      .transaction()
      .execute((trx) =>
        enqueueNodeCommand(trx, { nodeId: node.nodeId, kind: 'gpu.reset', payload: { gpuUuid: gpu } }),
      );
    await eventually(async () => node.hardware.sideEffects.length === 1);
    await node.agent.stop();
    const hardware = new SimHardware(node.hardware.seed);
    const restarted = new NodeAgent({
      identity: { ...loadIdentity(node.dir), gateway: fx.gateway.address },
      stateDir: node.dir,
      roots: { cdiDir: `${node.dir}/cdi`, envDir: `${node.dir}/allocations` },
      hardware,
      log: gatewayTestLog,
      minBackoffMs: 100,
    });
    restarted.start();
    try {
      const done = await eventually(async () => {
        const c = await findNodeCommand(db, reset.id);
        return c?.state === 'failed' ? c : null;
      });
      expect(done.error).toContain('not run again');
      expect(hardware.sideEffects).toEqual([]);
      // A command whose not_after has passed is never run.
      const late = await db.transaction().execute((trx) =>
        enqueueNodeCommand(trx, {
          nodeId: node.nodeId,
          kind: 'gpu.reset',
          payload: { gpuUuid: gpu },
          notAfter: new Date(Date.now() - 1_000),
        }),
      );
      await eventually(async () => (await findNodeCommand(db, late.id))?.state === 'expired');
      expect(hardware.sideEffects).toEqual([]);
    } finally {
      await restarted.stop();
    }
  });

  it('a silenced node becomes NodeUnreachable within the lease; a gateway restart reconnects with a new epoch', async () => {
    const db = fx.database.db;
    const node = fx.fleet.nodes[1]!;
    const before = await db
      .selectFrom('nodes')
      .select('epoch')
      .where('id', '=', node.nodeId)
      .executeTakeFirstOrThrow();
    const allocationId = await db.transaction().execute((trx) =>
      insertBareAllocation(trx, {
        poolId: fx.poolId,
        nodeId: node.nodeId,
        start: new Date(),
        end: new Date(Date.now() + 3600_000),
      }),
    );
    const held = await db
      .selectFrom('allocations')
      .select(['reservation_id', 'state'])
      .where('id', '=', allocationId)
      .executeTakeFirstOrThrow();
    node.agent.silence(true);
    const started = Date.now();
    await eventually(async () => {
      const c = await db
        .selectFrom('node_conditions')
        .selectAll()
        .where('node_id', '=', node.nodeId)
        .where('type', '=', 'NodeUnreachable')
        .executeTakeFirst();
      return c ?? null;
    }, 10_000);
    // The lease (1.5 s) plus the liveness loop's period; generous for a loaded machine.
    expect(Date.now() - started).toBeLessThan(6_000);
    const unreachable = await db
      .selectFrom('nodes')
      .select('connectivity')
      .where('id', '=', node.nodeId)
      .executeTakeFirstOrThrow();
    expect(unreachable.connectivity).toBe('unreachable');
    // Nothing it holds is released; its reservation's lifecycle is woken to look.
    const kept = await db
      .selectFrom('allocations')
      .select(['reservation_id', 'state'])
      .where('id', '=', allocationId)
      .executeTakeFirstOrThrow();
    expect(kept).toEqual(held);
    const wakes = () =>
      fx.lifecycle.signals.filter((s) => s.reservationId === held.reservation_id && s.signal.type === 'wake');
    await eventually(async () =>
      wakes().some((s) => s.signal.type === 'wake' && s.signal.reason === 'node-unreachable'),
    );
    node.agent.silence(false);
    await eventually(async () => {
      const n = await db
        .selectFrom('nodes')
        .select(['connectivity', 'epoch'])
        .where('id', '=', node.nodeId)
        .executeTakeFirst();
      return n?.connectivity === 'connected' && Number(n.epoch) > Number(before.epoch);
    });

    await eventually(async () =>
      wakes().some((s) => s.signal.type === 'wake' && s.signal.reason === 'node-reconnected'),
    );

    const epochBefore = await db
      .selectFrom('nodes')
      .select('epoch')
      .where('id', '=', node.nodeId)
      .executeTakeFirstOrThrow();
    await fx.restart();
    await eventually(async () => {
      const n = await db
        .selectFrom('nodes')
        .select(['epoch', 'connectivity', 'session_gateway'])
        .where('id', '=', node.nodeId)
        .executeTakeFirst();
      return n && Number(n.epoch) > Number(epochBefore.epoch) && n.session_gateway === fx.gateway.gatewayId;
    }, 10_000);
    // The restart released nothing.
    const afterRestart = await db
      .selectFrom('allocations')
      .select(['reservation_id', 'state'])
      .where('id', '=', allocationId)
      .executeTakeFirstOrThrow();
    expect(afterRestart).toEqual(held);
    const conditions = await db
      .selectFrom('node_conditions')
      .selectAll()
      .where('node_id', '=', node.nodeId)
      .execute();
    expect(conditions.filter((c) => c.type === 'NodeUnreachable')).toEqual([]);
  });
});
