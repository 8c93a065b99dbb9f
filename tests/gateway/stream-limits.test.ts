import { readFileSync } from 'node:fs';
import type { Metadata } from '@grpc/grpc-js';
import { describe, expect, it } from 'vitest';
import { gatewayChannel } from '../../daemon/gateway-tls.ts';
import { SimHardware } from '../../daemon/hardware.ts';
import { joinWithToken, loadIdentity } from '../../daemon/identity.ts';
import { attestedReportPurpose, signAllocationReport } from '../../domain/attestation.ts';
import { sectionHash } from '../../domain/inventory-sections.ts';
import { createCsr, generateKeyPairPem } from '../../domain/pki.ts';
import { type ControlMessage, JoinServiceClient } from '../../proto/gen/agent/v1/agent.ts';
import { insertBareAllocation } from '../support/allocations.ts';
import { eventually } from '../support/eventually.ts';
import { startTestGateway, useGatewayFixture } from '../support/gateway.ts';
import { openRawSession } from './raw-session.ts';

const journalOf = (dir: string): string => JSON.parse(readFileSync(`${dir}/journal.json`, 'utf8')).journalId;
const refusalsOf = (received: ControlMessage[]) =>
  received.flatMap((m) => (m.body?.$case === 'refusal' ? [m.body.value] : []));

/** `count` Join calls with a malformed token, one after another: each answer's code and pushback. */
async function joinBurst(address: string, ca: string, count: number) {
  const tls = gatewayChannel(address, { caCertificatePem: ca });
  const client = new JoinServiceClient(address, tls.credentials, tls.options);
  const csrPem = await createCsr(await generateKeyPairPem(), 'throttled');
  const answers: Array<{ code: number; pushbackMs: number | null }> = [];
  try {
    for (let i = 0; i < count; i++) {
      answers.push(
        await new Promise((resolve) =>
          client.join(
            {
              token: 'bcjt_nonsense',
              csrPem,
              evidence: undefined,
              requestedName: '',
              agentVersion: 'test',
              reclaimProof: undefined,
            },
            (err: (Error & { code: number; metadata: Metadata }) | null) => {
              const pushback = err?.metadata?.get('grpc-retry-pushback-ms')[0];
              resolve({ code: err?.code ?? 0, pushbackMs: pushback === undefined ? null : Number(pushback) });
            },
          ),
        ),
      );
    }
  } finally {
    client.close();
  }
  return answers;
}

describe('the throttle on Join', () => {
  const fx = useGatewayFixture({
    joinsPerSecondPerPeer: 0.05,
    joinBurstPerPeer: 3,
    joinsPerSecond: 1_000,
    joinBurst: 1_000,
  });

  it('answers a peer over its rate RESOURCE_EXHAUSTED with a retry pushback, before reading the request', async () => {
    const first = await joinBurst(fx.gateway.address, fx.gateway.caCertificatePem, 3);
    // A new connection from the same address shares the address's bucket.
    const second = await joinBurst(fx.gateway.address, fx.gateway.caCertificatePem, 3);
    const answers = [...first, ...second];
    expect(answers.map((a) => a.code)).toEqual([16, 16, 16, 8, 8, 8]);
    for (const a of second) expect(a.pushbackMs).toBeGreaterThan(0);
    expect(fx.gateway.stats().joinsThrottled).toBe(3);
  });

  it('holds all peers to the global rate', async () => {
    const gateway = await startTestGateway({
      db: fx.database.db,
      options: { joinsPerSecondPerPeer: 1_000, joinBurstPerPeer: 1_000, joinsPerSecond: 0.05, joinBurst: 2 },
    });
    try {
      const answers = await joinBurst(gateway.address, gateway.caCertificatePem, 3);
      expect(answers.map((a) => a.code)).toEqual([16, 16, 8]);
    } finally {
      await gateway.stop();
    }
  });

  it('bcd join waits out the pushback and gets in', async () => {
    const gateway = await startTestGateway({
      db: fx.database.db,
      // One join per 2 s from a peer: the second join is pushed back however slowly the machine
      // brings the two to the gateway.
      options: { joinsPerSecondPerPeer: 0.5, joinBurstPerPeer: 1, joinsPerSecond: 1_000, joinBurst: 1_000 },
    });
    try {
      const tokens = [await fx.token(1), await fx.token(1)];
      const join = async (name: string, token: string) =>
        joinWithToken({
          gateway: gateway.address,
          token,
          caCertificatePem: gateway.caCertificatePem,
          dir: `${fx.dir}/${name}`,
          evidence: new SimHardware(name).evidence(),
          requestedName: name,
          agentVersion: 'test',
        });
      const [first, second] = await Promise.all([
        join('patient-1', tokens[0]!),
        join('patient-2', tokens[1]!),
      ]);
      expect(first.nodeId).not.toBe(second.nodeId);
      expect(gateway.stats().joinsThrottled).toBeGreaterThan(0);
    } finally {
      await gateway.stop();
    }
  });
});

describe('connections that never say Hello', () => {
  const fx = useGatewayFixture(
    // The Hello deadline leaves room for B to connect while the silent ones still wait, on a
    // loaded machine.
    { maxSessions: 2, helloTimeoutMs: 12_000, maxPendingHellosPerNode: 2 },
    { nodes: 2, minBackoffMs: 100, until: 'connected' },
  );

  it('hold no session slot, are closed after the deadline, and are few per node', async () => {
    const [a, b] = [fx.fleet.nodes[0]!, fx.fleet.nodes[1]!];
    await b.agent.stop();
    await eventually(async () => fx.gateway.sessionCount() === 1);
    const identity = { ...loadIdentity(a.dir), gateway: fx.gateway.address };
    const silent = [
      await openRawSession(identity, fx.gateway.address, undefined, { hello: false }),
      await openRawSession(identity, fx.gateway.address, undefined, { hello: false }),
    ];
    await eventually(async () => fx.gateway.stats().awaitingHello === 2);
    const third = await openRawSession(identity, fx.gateway.address, undefined, { hello: false });
    try {
      // A third connection of the same node waiting for its Hello is refused.
      expect((await third.wait(() => third.ended())).code).toBe(8);
      // The limit is 2 sessions: the silent connections do not take B's place.
      b.agent.start();
      await eventually(async () => fx.gateway.sessionCount() === 2 && b.agent.status.connected);
      expect(silent.map((raw) => raw.ended())).toEqual([null, null]);
      for (const raw of silent) expect((await raw.wait(() => raw.ended(), 40_000)).code).toBe(4);
      expect(fx.gateway.stats()).toMatchObject({ awaitingHello: 0, sessions: 2 });
      expect(a.agent.status.connected).toBe(true);
    } finally {
      for (const raw of [...silent, third]) raw.close();
    }
  });
});

describe('per-node budgets for reports and inventory', () => {
  const fx = useGatewayFixture(
    { reportsPerSecond: 0.1, reportBurst: 3, inventoryPerMinute: 1, inventoryBurst: 2 },
    { nodes: 1, until: 'ready' },
  );

  it('refuse what goes beyond them (RATE_LIMITED) and store nothing of it', async () => {
    const db = fx.database.db;
    const node = fx.fleet.nodes[0]!;
    await node.agent.stop();
    const identity = { ...loadIdentity(node.dir), gateway: fx.gateway.address };
    const allocationId = await db.transaction().execute((trx) =>
      insertBareAllocation(trx, {
        poolId: fx.poolId,
        nodeId: node.nodeId,
        start: new Date(),
        end: new Date(Date.now() + 3600_000),
      }),
    );
    const raw = await openRawSession(identity, fx.gateway.address, journalOf(node.dir));
    try {
      await raw.wait(() => raw.received.find((m) => m.body?.$case === 'welcome'));
      for (let i = 0; i < 6; i++) {
        raw.send({
          body: {
            $case: 'report',
            value: signAllocationReport(
              {
                purpose: attestedReportPurpose,
                nodeId: node.nodeId,
                allocationId,
                specGeneration: 1,
                atMs: Date.now(),
                kind: { $case: 'released', value: { reason: `try ${i}` } },
              },
              identity.privateKeyPem,
            ),
          },
        });
      }
      const acks = await raw.wait(() => {
        const all = raw.received.flatMap((m) => (m.body?.$case === 'reportAck' ? [m.body.value] : []));
        return all.length === 6 ? all : null;
      });
      expect(acks.map((a) => a.accepted)).toEqual([true, true, true, false, false, false]);
      const stored = await db
        .selectFrom('allocation_reports')
        .select('id')
        .where('allocation_id', '=', allocationId)
        .execute();
      expect(stored).toHaveLength(3);

      const snapshots = async () =>
        (await db.selectFrom('inventory_snapshots').select('id').where('node_id', '=', node.nodeId).execute())
          .length;
      const before = await snapshots();
      const gpus = { ...node.hardware.gpus() };
      for (let i = 0; i < 3; i++) {
        raw.send({
          body: {
            $case: 'inventory',
            value: {
              sections: [{ name: 'gpus', hash: sectionHash(gpus), data: Buffer.from(JSON.stringify(gpus)) }],
            },
          },
        });
      }
      // The agent's first inventory took one of the two; at most one more gets through.
      await raw.wait(() => refusalsOf(raw.received).filter((r) => r.subject === 'inventory').length >= 2);
      expect((await snapshots()) - before).toBeLessThanOrEqual(1);
      expect(refusalsOf(raw.received).every((r) => r.code === 'RATE_LIMITED')).toBe(true);
      expect(fx.gateway.stats().rateLimited).toBeGreaterThanOrEqual(5);
    } finally {
      raw.close();
    }
  });
});
