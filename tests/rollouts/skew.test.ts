import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { Metadata } from '@grpc/grpc-js';
import { afterAll, describe, expect, it } from 'vitest';
import { gatewayChannel } from '../../daemon/gateway-tls.ts';
import { loadIdentity } from '../../daemon/identity.ts';
import type { SimulatedFleet } from '../../daemon/sim.ts';
import { acceptProtocolVersion, currentProtocolVersion } from '../../domain/release-version.ts';
import { AgentServiceClient, type ControlMessage } from '../../proto/gen/agent/v1/agent.ts';
import { eventually } from '../support/eventually.ts';
import { joinSimulatedFleet, useGatewayFixture } from '../support/gateway.ts';

const fx = useGatewayFixture({ heartbeatIntervalMs: 1_000 });
const dir = mkdtempSync(path.join(tmpdir(), 'bc-skew-'));
const fleets: SimulatedFleet[] = [];
afterAll(async () => {
  await Promise.all(fleets.map((f) => f.stop()));
  rmSync(dir, { recursive: true, force: true });
});

describe('mixed bcd versions against one gateway (N-2)', () => {
  it('three simulated bcd versions, protocols N, N-1 and N-2, hold sessions and run commands at once', async () => {
    const versions = [
      { version: '0.1.0', protocolVersion: currentProtocolVersion - 2 },
      { version: '0.2.0', protocolVersion: currentProtocolVersion - 1 },
      { version: '0.3.0', protocolVersion: currentProtocolVersion },
    ];
    for (const v of versions) {
      fleets.push(
        await joinSimulatedFleet(fx.gateway, fx.database.db, fx.poolId, {
          nodes: 2,
          rootDir: path.join(dir, v.version),
          namePrefix: `v${v.version.replaceAll('.', '-')}`,
          bcd: { version: v.version, protocolVersion: v.protocolVersion },
        }),
      );
    }
    await eventually(async () => fx.gateway.sessionCount() === 6);
    const rows = await fx.database.db
      .selectFrom('nodes')
      .select(['agent_version', 'protocol_version', 'connectivity'])
      .execute();
    expect(rows.map((r) => `${r.agent_version}@${r.protocol_version}`).sort()).toEqual([
      `0.1.0@${currentProtocolVersion - 2}`,
      `0.1.0@${currentProtocolVersion - 2}`,
      `0.2.0@${currentProtocolVersion - 1}`,
      `0.2.0@${currentProtocolVersion - 1}`,
      `0.3.0@${currentProtocolVersion}`,
      `0.3.0@${currentProtocolVersion}`,
    ]);
    // Every version runs a command through the same gateway.
    const { enqueueNodeCommand } = await import('../../db/nodes/commands.ts');
    const nodes = await fx.database.db.selectFrom('nodes').select('id').execute();
    const ids = await fx.database.db
      .transaction()
      .execute(async (trx) =>
        Promise.all(nodes.map((n) => enqueueNodeCommand(trx, { nodeId: n.id, kind: 'inventory.refresh' }))),
      );
    await eventually(async () => {
      const done = await fx.database.db
        .selectFrom('node_commands')
        .select('state')
        .where(
          'id',
          'in',
          ids.map((c) => c.id),
        )
        .execute();
      return done.every((c) => c.state === 'succeeded');
    });
  });

  it('a bcd newer than the control plane is refused at Hello with a message that says what to do', async () => {
    const identity = loadIdentity(path.join(dir, '0.3.0', 'v0-3-0-0000'));
    const tls = gatewayChannel(fx.gateway.address, identity);
    const client = new AgentServiceClient(fx.gateway.address, tls.credentials, tls.options);
    const stream = client.session(new Metadata());
    const ended = new Promise<{ code: number; details: string }>((resolve) => {
      stream.on('error', (e: { code: number; details: string }) => resolve(e));
      stream.on('data', (_: ControlMessage) => {});
    });
    stream.write({
      body: {
        $case: 'hello',
        value: {
          nodeId: identity.nodeId,
          agentVersion: '9.0.0',
          protocolVersion: currentProtocolVersion + 1,
          capabilities: [],
          journalId: 'jrn_skewtest0001',
          lastAckedSeq: 0,
          observedGeneration: 0,
          inventory: [],
        },
      },
    });
    const error = await ended;
    client.close();
    expect(error.details).toMatch(
      new RegExp(
        `speaks session protocol ${currentProtocolVersion + 1}, newer than this control plane's ${currentProtocolVersion}.*upgrade the control plane`,
      ),
    );
  });

  it('the window is N-2: older protocols are refused too (pure rule)', () => {
    expect(acceptProtocolVersion(0, 3)).toBe(1);
    expect(() => acceptProtocolVersion(2, 5)).toThrow(
      /older than this control plane accepts \(3 to 5\): update bcd/,
    );
    expect(acceptProtocolVersion(3, 5)).toBe(3);
  });
});
