import { describe, expect, it } from 'vitest';
import { enqueueNodeCommand, findNodeCommand } from '../../db/nodes/commands.ts';
import { eventually } from '../support/eventually.ts';
import { useGatewayFixture } from '../support/gateway.ts';

describe('inventory changes and retry pushback', () => {
  const fx = useGatewayFixture({ maxSessions: 2 }, { nodes: 3, shape: { gpus: 4, nvlinkDomainSize: 2 } });

  it('a gateway at its limit refuses with a retry pushback that bcd honours', async () => {
    await eventually(async () => fx.fleet.nodes.some((n) => n.agent.status.lastPushbackMs !== null));
    await eventually(async () => fx.gateway.sessionCount() === 2);
    const refused = fx.fleet.nodes.find((n) => n.agent.status.lastPushbackMs !== null)!;
    expect(refused.agent.status.lastPushbackMs).toBeGreaterThanOrEqual(500);
    expect(refused.agent.status.connected).toBe(false);
    // Room appears: the refused node gets in after its pushback. The gateway counts a session before
    // its agent has read the welcome, so wait for an agent that knows it is connected.
    const connected = await eventually(async () => fx.fleet.nodes.find((n) => n.agent.status.connected));
    await connected.agent.stop();
    await eventually(async () => refused.agent.status.connected, 35_000);
  }, 60_000);

  it('a GPU the driver no longer sees raises GpuCountMismatch and removes the device', async () => {
    const db = fx.database.db;
    const node = await eventually(async () => fx.fleet.nodes.find((n) => n.agent.status.connected));
    const domains = await eventually(async () => {
      const rows = await db
        .selectFrom('devices')
        .select('attributes')
        .where('node_id', '=', node.nodeId)
        .execute();
      return rows.length === 4 ? rows : null;
    });
    expect(new Set(domains.map((d) => d.attributes.nvlinkDomain))).toEqual(new Set(['nvl-0', 'nvl-1']));
    node.hardware.hiddenGpus = 1;
    const command = await db
      .transaction()
      .execute((trx) => enqueueNodeCommand(trx, { nodeId: node.nodeId, kind: 'inventory.refresh' }));
    await eventually(async () => (await findNodeCommand(db, command.id))?.state === 'succeeded');
    const condition = await eventually(() =>
      db
        .selectFrom('node_conditions')
        .selectAll()
        .where('node_id', '=', node.nodeId)
        .where('type', '=', 'GpuCountMismatch')
        .executeTakeFirst(),
    );
    expect(condition).toMatchObject({
      effect: 'NoSchedule',
      message: 'the PCI bus has 4 GPUs, the driver sees 3',
    });
    const live = await db
      .selectFrom('devices')
      .select('id')
      .where('node_id', '=', node.nodeId)
      .where('removed_at', 'is', null)
      .execute();
    expect(live).toHaveLength(3);
    node.hardware.hiddenGpus = 0;
    await db
      .transaction()
      .execute((trx) => enqueueNodeCommand(trx, { nodeId: node.nodeId, kind: 'inventory.refresh' }));
    await eventually(async () => {
      const c = await db
        .selectFrom('node_conditions')
        .select('type')
        .where('node_id', '=', node.nodeId)
        .where('type', '=', 'GpuCountMismatch')
        .executeTakeFirst();
      return !c;
    });
  });
});
