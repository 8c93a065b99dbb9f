import { existsSync, readFileSync } from 'node:fs';
import { describe, expect, it } from 'vitest';
import { loadIdentity } from '../../daemon/identity.ts';
import { findAttestationCertificates } from '../../db/nodes/certificates.ts';
import { setNodeDevicesAssignment } from '../../db/nodes/nodes.ts';
import {
  attestedReportPurpose,
  signAllocationReport,
  verifyAttestedReport,
} from '../../domain/attestation.ts';
import { generateKeyPairPem } from '../../domain/pki.ts';
import { insertBareAllocation } from '../support/allocations.ts';
import { eventually } from '../support/eventually.ts';
import { useGatewayFixture } from '../support/gateway.ts';
import { openRawSession } from './raw-session.ts';

describe('NodeSpec delivery and attested reports', () => {
  const fx = useGatewayFixture({}, { nodes: 2, until: 'ready' });

  async function allocate(nodeIndex: number, gpus: number) {
    const db = fx.database.db;
    const node = fx.fleet.nodes[nodeIndex]!;
    const devices = await db
      .selectFrom('devices')
      .select(['id', 'stable_id'])
      .where('node_id', '=', node.nodeId)
      .orderBy('stable_id')
      .limit(gpus)
      .execute();
    const start = new Date();
    const end = new Date(start.getTime() + 3600_000);
    const allocationId = await db
      .transaction()
      .execute((trx) => insertBareAllocation(trx, { poolId: fx.poolId, nodeId: node.nodeId, start, end }));
    return { node, devices, allocationId, until: end.getTime() };
  }

  it('delivers the devices section, bcd writes CDI and env files, and reports a verifiable signed binding', async () => {
    const db = fx.database.db;
    const { node, devices, allocationId, until } = await allocate(0, 2);
    const assignment = {
      allocationId,
      deviceIds: devices.map((d) => d.id),
      stableIds: devices.map((d) => d.stable_id),
      until,
      binding: 'hold' as const,
    };
    const first = await db
      .transaction()
      .execute((trx) => setNodeDevicesAssignment(trx, node.nodeId, [assignment]));
    expect(first).toEqual({ generation: 2, changed: true });
    const again = await db
      .transaction()
      .execute((trx) => setNodeDevicesAssignment(trx, node.nodeId, [assignment]));
    expect(again).toEqual({ generation: 2, changed: false });

    const row = await eventually(async () => {
      const a = await db
        .selectFrom('allocations')
        .selectAll()
        .where('id', '=', allocationId)
        .executeTakeFirst();
      return a?.bound_report ? a : null;
    });
    const cdi = JSON.parse(readFileSync(`${node.dir}/cdi/bcd-${allocationId}.json`, 'utf8'));
    expect(cdi.kind).toBe('bcd.dev/gpu');
    expect(cdi.devices.map((d: { name: string }) => d.name).sort()).toEqual(
      devices.map((d) => d.stable_id).sort(),
    );
    const env = readFileSync(`${node.dir}/allocations/${allocationId}.env`, 'utf8');
    expect(env).toContain(`NVIDIA_VISIBLE_DEVICES=${devices.map((d) => d.stable_id).join(',')}`);

    const certificates = await findAttestationCertificates(db, row.bound_sig_kid!);
    const verdict = verifyAttestedReport({
      body: row.bound_report,
      keyId: row.bound_sig_kid,
      signature: row.bound_sig,
      allocationId,
      nodeId: node.nodeId,
      certificates,
      now: new Date(),
      expectedGpuUuids: devices.map((d) => d.stable_id),
    });
    expect(verdict.ok).toBe(true);
    expect(fx.lifecycle.signals).toContainEqual({
      reservationId: expect.any(String),
      signal: { type: 'allocationReport', allocationId, kind: 'bound' },
    });
    await eventually(async () => {
      const n = await db
        .selectFrom('nodes')
        .select('observed_generation')
        .where('id', '=', node.nodeId)
        .executeTakeFirst();
      return n?.observed_generation === '2';
    });

    // The node's genuine signature over this allocation, presented as another allocation's binding.
    const other = await allocate(0, 1);
    const replay = verifyAttestedReport({
      body: row.bound_report,
      keyId: row.bound_sig_kid,
      signature: row.bound_sig,
      allocationId: other.allocationId,
      nodeId: node.nodeId,
      certificates,
      now: new Date(),
    });
    expect(replay).toEqual({ ok: false, reason: 'the signed report is not this allocation bound' });

    // Releasing: the assignment goes, the files go, the node reports released.
    await db.transaction().execute((trx) => setNodeDevicesAssignment(trx, node.nodeId, []));
    await eventually(async () => !existsSync(`${node.dir}/cdi/bcd-${allocationId}.json`));
    expect(existsSync(`${node.dir}/allocations/${allocationId}.env`)).toBe(false);
    await eventually(async () =>
      fx.lifecycle.signals.some((s) => s.signal.type === 'allocationReport' && s.signal.kind === 'released'),
    );
  });

  it('refuses reports about another node, and unsigned or foreign-signed reports never verify', async () => {
    const db = fx.database.db;
    const target = await allocate(0, 1);
    const intruder = fx.fleet.nodes[1]!;
    await intruder.agent.stop();
    const identity = { ...loadIdentity(intruder.dir), gateway: fx.gateway.address };
    const raw = await openRawSession(identity, fx.gateway.address);
    try {
      await raw.wait(() => raw.received.find((m) => m.body?.$case === 'welcome'));
      const report = (allocationId: string, nodeId: string) => ({
        purpose: attestedReportPurpose,
        nodeId,
        allocationId,
        specGeneration: 1,
        atMs: Date.now(),
        kind: {
          $case: 'bound' as const,
          value: { cdiDevices: [], envFile: '', cdiSpecFile: '', cgroupParent: '', gpuUuids: [] },
        },
      });
      // Another node's allocation, genuinely signed by the intruder: refused like an unknown one.
      raw.send({
        body: {
          $case: 'report',
          value: signAllocationReport(report(target.allocationId, intruder.nodeId), identity.privateKeyPem),
        },
      });
      const refusal = await raw.wait(() => raw.received.find((m) => m.body?.$case === 'refusal'));
      expect(refusal.body?.$case === 'refusal' && refusal.body.value.code).toBe('NOT_FOUND');
      const stored = await db
        .selectFrom('allocation_reports')
        .selectAll()
        .where('allocation_id', '=', target.allocationId)
        .execute();
      expect(stored).toHaveLength(0);
      const allocation = await db
        .selectFrom('allocations')
        .selectAll()
        .where('id', '=', target.allocationId)
        .executeTakeFirstOrThrow();
      expect(allocation.bound_report).toBeNull();
    } finally {
      raw.close();
    }

    // Unsigned and foreign-key reports are stored as received but never verify.
    const own = fx.fleet.nodes[0]!;
    const signed = signAllocationReport(
      {
        purpose: attestedReportPurpose,
        nodeId: own.nodeId,
        allocationId: target.allocationId,
        specGeneration: 1,
        atMs: Date.now(),
        kind: {
          $case: 'bound',
          value: { cdiDevices: [], envFile: '', cdiSpecFile: '', cgroupParent: '', gpuUuids: [] },
        },
      },
      (await generateKeyPairPem()).privateKeyPem,
    );
    const foreign = verifyAttestedReport({
      ...signed,
      allocationId: target.allocationId,
      nodeId: own.nodeId,
      certificates: await findAttestationCertificates(db, signed.keyId),
      now: new Date(),
    });
    expect(foreign).toEqual({ ok: false, reason: 'unknown signing key' });
    const unsigned = verifyAttestedReport({
      body: signed.body,
      keyId: null,
      signature: null,
      allocationId: target.allocationId,
      nodeId: own.nodeId,
      certificates: [],
      now: new Date(),
    });
    expect(unsigned).toEqual({ ok: false, reason: 'unsigned report' });
  });
});
