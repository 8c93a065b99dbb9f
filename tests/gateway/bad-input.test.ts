import { readFileSync } from 'node:fs';
import { Client, Metadata } from '@grpc/grpc-js';
import { describe, expect, it } from 'vitest';
import { gatewayChannel } from '../../daemon/gateway-tls.ts';
import { loadIdentity, renewCertificate } from '../../daemon/identity.ts';
import { findAttestationCertificates, revokeNodeCertificates } from '../../db/nodes/certificates.ts';
import { enqueueNodeCommand, findNodeCommand } from '../../db/nodes/commands.ts';
import { AgentMessage, CommandOutcome, type ControlMessage } from '../../proto/gen/agent/v1/agent.ts';
import { insertBareAllocation } from '../support/allocations.ts';
import { eventually } from '../support/eventually.ts';
import { startTestGateway, useGatewayFixture } from '../support/gateway.ts';
import { openRawSession } from './raw-session.ts';

const refusalsOf = (received: ControlMessage[]) =>
  received.flatMap((m) => (m.body?.$case === 'refusal' ? [m.body.value] : []));

describe('bad input on sessions', () => {
  const fx = useGatewayFixture(
    { maxMessageBytes: 64 * 1024, messagesPerSecond: 50, messageBurst: 50, maxRefusals: 200 },
    { nodes: 3, minBackoffMs: 100, until: 'connected' },
  );

  it('refuses unknown commands, sequences that go backwards, and generations that go backwards', async () => {
    const db = fx.database.db;
    const node = fx.fleet.nodes[0]!;
    await node.agent.stop();
    const identity = { ...loadIdentity(node.dir), gateway: fx.gateway.address };
    const raw = await openRawSession(identity, fx.gateway.address, journalOf(node.dir));
    try {
      await raw.wait(() => raw.received.find((m) => m.body?.$case === 'spec'));
      const command = await db
        .transaction()
        .execute((trx) => enqueueNodeCommand(trx, { nodeId: node.nodeId, kind: 'inventory.refresh' }));
      await raw.wait(() => raw.received.find((m) => m.body?.$case === 'command'));
      const result = (id: string, seq: number) => ({
        body: {
          $case: 'commandResult' as const,
          value: {
            commandId: id,
            seq,
            outcome: CommandOutcome.COMMAND_OUTCOME_SUCCEEDED,
            resultJson: Buffer.alloc(0),
            error: '',
          },
        },
      });
      raw.send(result('cmd_01unknown000000000000000000', 1));
      raw.send(result(command.id, command.seq - 1));
      raw.send({ body: { $case: 'specStatus', value: { observedGeneration: 1, error: '' } } });
      raw.send({ body: { $case: 'specStatus', value: { observedGeneration: 0, error: '' } } });
      raw.send({ body: { $case: 'specStatus', value: { observedGeneration: 99, error: '' } } });
      raw.send({ body: undefined as never });
      await raw.wait(() => refusalsOf(raw.received).length >= 5);
      expect(refusalsOf(raw.received).map((r) => r.code)).toEqual([
        'NOT_FOUND',
        'INVALID_INPUT',
        'INVALID_INPUT',
        'INVALID_INPUT',
        'INVALID_INPUT',
      ]);
      expect((await findNodeCommand(db, command.id))?.state).toBe('delivered');
      const row = await db
        .selectFrom('nodes')
        .select('observed_generation')
        .where('id', '=', node.nodeId)
        .executeTakeFirstOrThrow();
      expect(row.observed_generation).toBe('1');
      raw.send(result(command.id, command.seq));
      await eventually(async () => (await findNodeCommand(db, command.id))?.state === 'succeeded');
    } finally {
      raw.close();
    }
  });

  it('a Hello naming another node, or without a journal id, ends the session at once', async () => {
    const [a, b] = [fx.fleet.nodes[0]!, fx.fleet.nodes[1]!];
    const identity = { ...loadIdentity(a.dir), gateway: fx.gateway.address };
    const before = await fx.database.db.selectFrom('nodes').select(['id', 'epoch']).orderBy('id').execute();
    const impostor = await openRawSession({ ...identity, nodeId: b.nodeId }, fx.gateway.address);
    expect((await impostor.wait(() => impostor.ended())).code).toBe(7);
    impostor.close();
    const nameless = await openRawSession(identity, fx.gateway.address, '');
    expect((await nameless.wait(() => nameless.ended())).code).toBe(3);
    nameless.close();
    const after = await fx.database.db.selectFrom('nodes').select(['id', 'epoch']).orderBy('id').execute();
    expect(after).toEqual(before);
  });

  it('a malformed or oversized message ends the session and changes nothing', async () => {
    const db = fx.database.db;
    const node = fx.fleet.nodes[1]!;
    await node.agent.stop();
    const identity = loadIdentity(node.dir);
    const tls = gatewayChannel(fx.gateway.address, identity);
    const client = new Client(fx.gateway.address, tls.credentials, tls.options);
    const hello = Buffer.from(
      AgentMessage.encode({
        body: {
          $case: 'hello',
          value: {
            nodeId: node.nodeId,
            agentVersion: 'raw',
            protocolVersion: 0,
            capabilities: [],
            journalId: journalOf(node.dir),
            lastAckedSeq: 0,
            observedGeneration: 0,
            inventory: [],
          },
        },
      }).finish(),
    );
    const before = await db
      .selectFrom('devices')
      .select(['id', 'health'])
      .where('node_id', '=', node.nodeId)
      .execute();
    for (const payload of [
      Buffer.from([0x0a, 0xff, 0xff, 0xff, 0xff, 0x0f]),
      Buffer.alloc(128 * 1024, 0x41),
    ]) {
      const stream = client.makeBidiStreamRequest(
        '/agent.v1.AgentService/Session',
        (b: Buffer) => b,
        (b: Buffer) => b,
        new Metadata(),
      );
      let welcomed!: () => void;
      const opened = new Promise<void>((resolve) => {
        welcomed = resolve;
      });
      const ended = new Promise<number>((resolve) => {
        stream.on('error', (e: { code: number }) => resolve(e.code));
        stream.on('data', () => welcomed());
      });
      stream.write(hello);
      // The session is open (its Welcome came) before the bad message, or it ended trying.
      await Promise.race([opened, ended]);
      stream.write(payload);
      expect(await ended).not.toBe(0);
    }
    client.close();
    const after = await db
      .selectFrom('devices')
      .select(['id', 'health'])
      .where('node_id', '=', node.nodeId)
      .execute();
    expect(after).toEqual(before);
    expect(
      await db.selectFrom('inventory_snapshots').select('id').where('node_id', '=', node.nodeId).execute(),
    ).toHaveLength(2);
  });

  it('a flood from one node is cut off and cannot starve the others', async () => {
    const db = fx.database.db;
    const flooder = fx.fleet.nodes[2]!;
    await flooder.agent.stop();
    const raw = await openRawSession(
      { ...loadIdentity(flooder.dir), gateway: fx.gateway.address },
      fx.gateway.address,
      journalOf(flooder.dir),
    );
    await raw.wait(() => raw.received.find((m) => m.body?.$case === 'welcome'));
    const victim = fx.fleet.nodes[0]!;
    await victim.agent.stop();
    victim.agent.start();
    await eventually(async () => fx.gateway.sessionCount() >= 2);
    for (let i = 0; i < 1_000; i++)
      raw.send({ body: { $case: 'heartbeat', value: { sentAtMs: Date.now(), observedGeneration: 0 } } });
    const started = Date.now();
    const command = await db
      .transaction()
      .execute((trx) => enqueueNodeCommand(trx, { nodeId: victim.nodeId, kind: 'diag.nvml', payload: {} }));
    await eventually(async () => (await findNodeCommand(db, command.id))?.state === 'succeeded', 20_000);
    expect(Date.now() - started).toBeLessThan(2_000);
    const ended = await raw.wait(() => raw.ended());
    expect(ended.code).toBe(8);
    expect(refusalsOf(raw.received).every((r) => r.code === 'RATE_LIMITED')).toBe(true);
    raw.close();
  });

  it('a report on a session fenced by another gateway changes nothing', async () => {
    const db = fx.database.db;
    const node = fx.fleet.nodes[0]!;
    await node.agent.stop();
    const second = await startTestGateway({ db });
    const identity = loadIdentity(node.dir);
    const journal = journalOf(node.dir);
    const first = await openRawSession(
      { ...identity, gateway: fx.gateway.address },
      fx.gateway.address,
      journal,
    );
    try {
      await first.wait(() => first.received.find((m) => m.body?.$case === 'welcome'));
      const other = await openRawSession({ ...identity, gateway: second.address }, second.address, journal);
      await other.wait(() => other.received.find((m) => m.body?.$case === 'welcome'));
      const window = {
        poolId: fx.poolId,
        nodeId: node.nodeId,
        start: new Date(),
        end: new Date(Date.now() + 3600_000),
      };
      const allocationId = await db.transaction().execute((trx) => insertBareAllocation(trx, window));
      const { signAllocationReport, attestedReportPurpose } = await import('../../domain/attestation.ts');
      first.send({
        body: {
          $case: 'report',
          value: signAllocationReport(
            {
              purpose: attestedReportPurpose,
              nodeId: node.nodeId,
              allocationId,
              specGeneration: 1,
              atMs: Date.now(),
              kind: { $case: 'failed', value: { reason: 'x', message: '' } },
            },
            identity.privateKeyPem,
          ),
        },
      });
      const ended = await first.wait(() => first.ended());
      expect(ended.code).toBe(10);
      expect(
        await db
          .selectFrom('allocation_reports')
          .select('id')
          .where('allocation_id', '=', allocationId)
          .execute(),
      ).toEqual([]);
      other.close();
    } finally {
      first.close();
      await second.stop();
    }
  });

  it('renews a certificate over mutual TLS, revoking the one it replaces, and refuses a revoked one', async () => {
    const db = fx.database.db;
    const node = fx.fleet.nodes[1]!;
    const identity = { ...loadIdentity(node.dir), gateway: fx.gateway.address };
    const before = readFileSync(`${node.dir}/cert.pem`, 'utf8');
    const notAfter = await renewCertificate(identity, node.dir);
    expect(readFileSync(`${node.dir}/cert.pem`, 'utf8')).not.toBe(before);
    expect(notAfter.getTime()).toBeGreaterThan(Date.now() + 23 * 3600_000);
    const certs = await db
      .selectFrom('node_certificates')
      .select(['serial', 'key_id', 'revoked_at', 'revoke_reason'])
      .where('node_id', '=', node.nodeId)
      .orderBy('created_at')
      .execute();
    expect(certs).toHaveLength(2);
    expect(certs[0]).toMatchObject({ revoke_reason: 'superseded' });
    expect(certs[0]!.revoked_at).not.toBeNull();
    expect(certs[1]).toMatchObject({ revoked_at: null, revoke_reason: null });
    // The replaced certificate renews nothing any more.
    await expect(
      renewCertificate({ ...identity, certificatePem: before }, `${fx.dir}/stale`),
    ).rejects.toMatchObject({ code: 16 });
    // What the node key signed stays verifiable: a superseded certificate is not revoked for cause.
    const attesting = await findAttestationCertificates(db, certs[0]!.key_id);
    expect(attesting.filter((c) => c.revokedAt === null)).toHaveLength(2);
    await revokeNodeCertificates(db, node.nodeId);
    await expect(renewCertificate(identity, node.dir)).rejects.toMatchObject({ code: 16 });
  });
});

function journalOf(dir: string): string {
  return JSON.parse(readFileSync(`${dir}/journal.json`, 'utf8')).journalId;
}
