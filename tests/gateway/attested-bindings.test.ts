import { readFileSync } from 'node:fs';
import { sql } from 'kysely';
import { describe, expect, it } from 'vitest';
import { loadIdentity } from '../../daemon/identity.ts';
import { judgeAllocationReport } from '../../db/allocations/reports.ts';
import { setNodeDevicesAssignment } from '../../db/nodes/nodes.ts';
import { attestedReportPurpose, signAllocationReport } from '../../domain/attestation.ts';
import { generateKeyPairPem } from '../../domain/pki.ts';
import type { AttestedReport } from '../../proto/gen/agent/v1/agent.ts';
import { insertBareAllocation } from '../support/allocations.ts';
import { eventually } from '../support/eventually.ts';
import { useGatewayFixture } from '../support/gateway.ts';
import { openRawSession } from './raw-session.ts';

describe('attested bindings through a real gateway', () => {
  const fx = useGatewayFixture({}, { nodes: 1, until: 'ready' });

  /** An allocation of `gpus` GPUs (offset `from`) on the node, booked, placed in `binding`. */
  async function booked(from: number, gpus: number) {
    const db = fx.database.db;
    const node = fx.fleet.nodes[0]!;
    const devices = await db
      .selectFrom('devices')
      .select(['id', 'stable_id'])
      .where('node_id', '=', node.nodeId)
      .orderBy('stable_id')
      .offset(from)
      .limit(gpus)
      .execute();
    const start = new Date();
    const end = new Date(start.getTime() + 3600_000);
    const allocationId = await db.transaction().execute(async (trx) => {
      const id = await insertBareAllocation(trx, { poolId: fx.poolId, nodeId: node.nodeId, start, end });
      for (const d of devices) {
        await sql`INSERT INTO device_bookings (device_id, allocation_id, during)
                  VALUES (${d.id}, ${id}, tstzrange(${start}, ${end}))`.execute(trx);
      }
      await trx.updateTable('allocations').set({ state: 'binding' }).where('id', '=', id).execute();
      return id;
    });
    return {
      allocationId,
      assignment: {
        allocationId,
        deviceIds: devices.map((d) => d.id),
        stableIds: devices.map((d) => d.stable_id),
        until: end.getTime(),
        binding: 'hold' as const,
      },
    };
  }

  const judge = (allocationId: string) =>
    fx.database.db.transaction().execute((trx) => judgeAllocationReport(trx, allocationId));
  const rejections = async (allocationId: string) =>
    (
      await fx.database.db
        .selectFrom('outbox_events')
        .select('data')
        .where('type', '=', 'reservation.binding-rejected')
        .execute()
    )
      .map((e) => e.data as { allocationId: string; reason: string })
      .filter((d) => d.allocationId === allocationId)
      .map((d) => d.reason);

  it('a genuine report binds; unsigned, foreign-signed and replayed reports never do', async () => {
    const db = fx.database.db;
    const node = fx.fleet.nodes[0]!;
    const good = await booked(0, 2);
    const victim = await booked(2, 2);
    await db.transaction().execute((trx) => setNodeDevicesAssignment(trx, node.nodeId, [good.assignment]));
    await eventually(async () => {
      const a = await db
        .selectFrom('allocations')
        .select('bound_report')
        .where('id', '=', good.allocationId)
        .executeTakeFirst();
      return a?.bound_report;
    });
    expect((await judge(good.allocationId)).outcome).toBe('bound');
    const bound = await db
      .selectFrom('allocations')
      .selectAll()
      .where('id', '=', good.allocationId)
      .executeTakeFirstOrThrow();
    expect(bound).toMatchObject({ state: 'bound', attested: true });
    expect((bound.binding as { cdiDevices: string[] }).cdiDevices.sort()).toEqual(
      good.assignment.stableIds.map((u) => `bcd.dev/gpu=${u}`).sort(),
    );
    expect((await judge(good.allocationId)).outcome).toBe('unchanged');

    // A compromised gateway replays the node's genuine report of one allocation as another's.
    const genuine = await db
      .selectFrom('allocation_reports')
      .selectAll()
      .where('allocation_id', '=', good.allocationId)
      .executeTakeFirstOrThrow();
    await db
      .insertInto('allocation_reports')
      .values({
        allocation_id: victim.allocationId,
        node_id: node.nodeId,
        kind: 'bound',
        epoch: genuine.epoch,
        report: genuine.report,
        sig_kid: genuine.sig_kid,
        sig: genuine.sig,
      })
      .execute();
    expect((await judge(victim.allocationId)).outcome).toBe('rejected');
    expect(await rejections(victim.allocationId)).toEqual(['the signed report is not this allocation bound']);

    // Unsigned and foreign-signed reports, sent by the node's own session about its own allocation.
    await node.agent.stop();
    const identity = { ...loadIdentity(node.dir), gateway: fx.gateway.address };
    const raw = await openRawSession(identity, fx.gateway.address, loadJournalId(node.dir));
    const body = (allocationId: string) => ({
      purpose: attestedReportPurpose,
      nodeId: node.nodeId,
      allocationId,
      specGeneration: 2,
      atMs: Date.now(),
      kind: {
        $case: 'bound' as const,
        value: {
          cdiDevices: victim.assignment.stableIds.map((u) => `bcd.dev/gpu=${u}`),
          envFile: '/run/bcd/allocations/x.env',
          cdiSpecFile: '',
          cgroupParent: '',
          gpuUuids: victim.assignment.stableIds,
        },
      },
    });
    const sendAndWait = async (report: AttestedReport) => {
      const before = raw.received.filter((m) => m.body?.$case === 'reportAck').length;
      raw.send({ body: { $case: 'report', value: report } });
      await raw.wait(() => raw.received.filter((m) => m.body?.$case === 'reportAck').length > before);
    };
    try {
      await raw.wait(() => raw.received.find((m) => m.body?.$case === 'welcome'));
      const genuineSig = signAllocationReport(body(victim.allocationId), identity.privateKeyPem);
      await sendAndWait({ body: genuineSig.body, keyId: '', signature: Buffer.alloc(0) });
      expect((await judge(victim.allocationId)).outcome).toBe('rejected');
      await sendAndWait(
        signAllocationReport(body(victim.allocationId), (await generateKeyPairPem()).privateKeyPem),
      );
      expect((await judge(victim.allocationId)).outcome).toBe('rejected');
      // A genuine signature with its bytes tampered with.
      await sendAndWait({ ...genuineSig, signature: Buffer.from(genuineSig.signature).reverse() });
      expect((await judge(victim.allocationId)).outcome).toBe('rejected');
      expect(await rejections(victim.allocationId)).toEqual([
        'the signed report is not this allocation bound',
        'unsigned report',
        'unknown signing key',
        'signature does not verify',
      ]);
      // A forged re-report of the active binding: the binding is lost, not replaced.
      await sendAndWait(
        signAllocationReport(body(good.allocationId), (await generateKeyPairPem()).privateKeyPem),
      );
      expect((await judge(good.allocationId)).outcome).toBe('binding-lost');
      const still = await db
        .selectFrom('allocations')
        .selectAll()
        .where('id', '=', good.allocationId)
        .executeTakeFirstOrThrow();
      expect(still.binding).toEqual(bound.binding);
    } finally {
      raw.close();
    }
    const victimRow = await db
      .selectFrom('allocations')
      .selectAll()
      .where('id', '=', victim.allocationId)
      .executeTakeFirstOrThrow();
    expect(victimRow).toMatchObject({ state: 'binding', attested: false, bound_at: null });
  });
});

/** The raw session continues the node's journal, so nothing in flight is failed. */
function loadJournalId(dir: string): string {
  return JSON.parse(readFileSync(`${dir}/journal.json`, 'utf8')).journalId;
}
