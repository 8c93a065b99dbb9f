import { cpSync, mkdirSync, rmSync } from 'node:fs';
import path from 'node:path';
import { describe, expect, it } from 'vitest';
import { NodeAgent } from '../../daemon/agent.ts';
import { SimHardware } from '../../daemon/hardware.ts';
import { joinWithToken, loadIdentity } from '../../daemon/identity.ts';
import { enqueueNodeCommand, findNodeCommand } from '../../db/nodes/commands.ts';
import { eventually } from '../support/eventually.ts';
import { gatewayTestLog, useGatewayFixture } from '../support/gateway.ts';

describe('reclaiming machines and losing journals', () => {
  const fx = useGatewayFixture({}, { nodes: 1, minBackoffMs: 100, until: 'connected' });

  const join = async (hardware: SimHardware, dir: string) =>
    joinWithToken({
      gateway: fx.gateway.address,
      token: await fx.token(1),
      caCertificatePem: fx.gateway.caCertificatePem,
      dir,
      evidence: hardware.evidence(),
      requestedName: 'again',
      agentVersion: 'test',
    });

  it('the same machine joining again with its key reclaims its node and revokes its old certificate', async () => {
    const db = fx.database.db;
    const node = fx.fleet.nodes[0]!;
    // The machine kept its identity (its key signs the reclaim proof), not its journal.
    mkdirSync(`${fx.dir}/rejoin`, { recursive: true });
    for (const file of ['key.pem', 'key.pub.pem', 'cert.pem', 'ca.pem', 'node.json'])
      cpSync(path.join(node.dir, file), path.join(`${fx.dir}/rejoin`, file));
    const again = await join(new SimHardware(node.hardware.seed), `${fx.dir}/rejoin`);
    expect(again).toMatchObject({ nodeId: node.nodeId, reclaimed: true });
    const certs = await db
      .selectFrom('node_certificates')
      .selectAll()
      .where('node_id', '=', node.nodeId)
      .execute();
    expect(certs.filter((c) => c.revoked_at === null)).toHaveLength(1);
    expect(certs.filter((c) => c.revoked_at !== null)).toHaveLength(1);
    // A machine whose identifiers are placeholders is never recognized: each join is a new node.
    const weak = new SimHardware('weak');
    weak.evidence = () => ({
      productUuid: '03000200-0400-0500-0006-000700080009',
      serialNumber: 'Default string',
      macs: ['02:42:ac:11:00:02'],
      gpuUuids: [],
      hostname: 'weak',
    });
    const first = await join(weak, `${fx.dir}/weak-1`);
    const second = await join(weak, `${fx.dir}/weak-2`);
    expect(first.nodeId).not.toBe(second.nodeId);
    expect(second.reclaimed).toBe(false);
    const row = await db
      .selectFrom('nodes')
      .select('hardware_key')
      .where('id', '=', first.nodeId)
      .executeTakeFirstOrThrow();
    expect(row.hardware_key).toBeNull();
  });

  it('a lost journal fails the commands that were in flight instead of replaying them', async () => {
    const db = fx.database.db;
    const identity = { ...loadIdentity(`${fx.dir}/rejoin`), gateway: fx.gateway.address };
    await fx.fleet.nodes[0]!.agent.stop();
    const hardware = new SimHardware(fx.fleet.nodes[0]!.hardware.seed);
    hardware.resetDelayMs = 60_000;
    const start = (h: SimHardware) => {
      const agent = new NodeAgent({
        identity,
        stateDir: `${fx.dir}/rejoin`,
        roots: { cdiDir: `${fx.dir}/rejoin/cdi`, envDir: `${fx.dir}/rejoin/allocations` },
        hardware: h,
        log: gatewayTestLog,
        minBackoffMs: 100,
      });
      agent.start();
      return agent;
    };
    const first = start(hardware);
    const gpu = hardware.gpus().gpus[0]!.uuid;
    const command = await db
      .transaction()
      .execute((trx) =>
        enqueueNodeCommand(trx, { nodeId: identity.nodeId, kind: 'gpu.reset', payload: { gpuUuid: gpu } }),
      );
    await eventually(async () => hardware.sideEffects.length === 1);
    await first.stop();
    rmSync(`${fx.dir}/rejoin/journal.json`);
    const fresh = new SimHardware(hardware.seed);
    const second = start(fresh);
    try {
      const failed = await eventually(async () => {
        const c = await findNodeCommand(db, command.id);
        return c?.state === 'failed' ? c : null;
      });
      expect(failed.error).toBe('the node lost its journal');
      await new Promise((r) => setTimeout(r, 300));
      expect(fresh.sideEffects).toEqual([]);
      const node = await db
        .selectFrom('nodes')
        .select('journal_id')
        .where('id', '=', identity.nodeId)
        .executeTakeFirstOrThrow();
      expect(node.journal_id).toBe(second.journal.journalId);
    } finally {
      await second.stop();
    }
  });
});
