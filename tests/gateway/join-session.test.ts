import { readFileSync } from 'node:fs';
import { describe, expect, it } from 'vitest';
import { eventually } from '../support/eventually.ts';
import { useGatewayFixture } from '../support/gateway.ts';

describe('joining and sessions', () => {
  const fx = useGatewayFixture();

  it('a simulated node joins with a token, opens a session and its inventory becomes devices', async () => {
    const fleet = await fx.startFleet({ nodes: 2 });
    const db = fx.database.db;
    const nodeId = fleet.nodes[0]!.nodeId;
    const node = await eventually(async () => {
      const row = await db.selectFrom('nodes').selectAll().where('id', '=', nodeId).executeTakeFirst();
      return row?.provision_state === 'ready' ? row : null;
    });
    expect(node.connectivity).toBe('connected');
    expect(Number(node.epoch)).toBe(1);
    expect(node.observed_generation).toBe('1');
    expect(node.pool_id).toBe(fx.poolId);
    const devices = await db.selectFrom('devices').selectAll().where('node_id', '=', nodeId).execute();
    expect(devices).toHaveLength(8);
    expect(new Set(devices.map((d) => d.attributes.nvlinkDomain))).toEqual(new Set(['nvl-0']));
    const labels = await db.selectFrom('node_labels').selectAll().where('node_id', '=', nodeId).execute();
    expect(labels).toContainEqual({
      node_id: nodeId,
      key: 'bc.dev/cap.devices.limits',
      value: 'true',
      source: 'system',
    });
    const resources = await db
      .selectFrom('host_resources')
      .selectAll()
      .where('node_id', '=', nodeId)
      .execute();
    expect(resources.find((r) => r.resource === 'vcpu')?.capacity).toBe('192');
    const certs = await db
      .selectFrom('node_certificates')
      .selectAll()
      .where('node_id', '=', nodeId)
      .execute();
    expect(certs).toHaveLength(1);
    expect(certs[0]!.spiffe_id).toBe(`spiffe://better-compute.local/site/${fx.siteId}/node/${nodeId}`);
    expect(certs[0]!.not_after.getTime() - certs[0]!.not_before.getTime()).toBeLessThanOrEqual(
      24 * 3600_000 + 60_000,
    );
    expect(readFileSync(`${fleet.nodes[0]!.dir}/journal.json`, 'utf8')).toContain('jrn_');
    await eventually(async () => fx.gateway.sessionCount() === 2);
  });
});
