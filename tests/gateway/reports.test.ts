import { existsSync, readFileSync } from 'node:fs';
import { describe, expect, it } from 'vitest';
import { SimHardware } from '../../daemon/hardware.ts';
import { joinWithToken, loadIdentity } from '../../daemon/identity.ts';
import { findAttestationCertificates } from '../../db/nodes/certificates.ts';
import { insertPool } from '../../db/nodes/fleet.ts';
import { createJoinToken } from '../../db/nodes/join-tokens.ts';
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
import { tableSnapshot } from '../support/table-snapshot.ts';
import { openRawSession } from './raw-session.ts';

describe('NodeSpec delivery and attested reports', () => {
  const fx = useGatewayFixture({}, { nodes: 2, until: 'ready' });

  async function allocate(nodeIndex: number, gpus: number, tenantId?: string) {
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
    const allocationId = await db.transaction().execute((trx) =>
      insertBareAllocation(trx, {
        poolId: fx.poolId,
        nodeId: node.nodeId,
        start,
        end,
        ...(tenantId ? { tenantId } : {}),
      }),
    );
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
  it("a node of another tenant's pool reporting about this pool's allocations is refused and changes nothing", async () => {
    const db = fx.database.db;
    const target = await allocate(0, 1, 'tnt_victim');
    const otherPoolId = await insertPool(db, {
      siteId: fx.siteId,
      ownerTenantId: 'tnt_other',
      name: 'other-tenant-pool',
      gpuModel: 'h100',
    });
    const { token } = await createJoinToken(db, { poolId: otherPoolId, ttlSeconds: 600 });
    const intruder = await joinWithToken({
      gateway: fx.gateway.address,
      token,
      caCertificatePem: fx.gateway.caCertificatePem,
      dir: `${fx.dir}/other-tenant-node`,
      evidence: new SimHardware('other-tenant-node').evidence(),
      requestedName: 'other-tenant-node',
      agentVersion: 'test',
    });
    const raw = await openRawSession(intruder, fx.gateway.address);
    const watched = [
      'public.allocations',
      'public.allocation_reports',
      'public.reservations',
      'public.device_bookings',
      'public.outbox_events',
      'public.audit_events',
    ];
    const snapshot = async () => {
      const all = await tableSnapshot(db);
      return watched.map((t) => [t, all[t]]);
    };
    try {
      await raw.wait(() => raw.received.find((m) => m.body?.$case === 'welcome'));
      const before = await snapshot();
      const signals = fx.lifecycle.signals.length;
      const report = (nodeId: string, kind: 'bound' | 'failed' | 'released') =>
        signAllocationReport(
          {
            purpose: attestedReportPurpose,
            nodeId,
            allocationId: target.allocationId,
            specGeneration: 1,
            atMs: Date.now(),
            kind:
              kind === 'bound'
                ? {
                    $case: 'bound',
                    value: { cdiDevices: [], envFile: '', cdiSpecFile: '', cgroupParent: '', gpuUuids: [] },
                  }
                : kind === 'failed'
                  ? { $case: 'failed', value: { reason: 'x', message: '' } }
                  : { $case: 'released', value: { reason: 'x' } },
          },
          intruder.privateKeyPem,
        );
      // Genuinely signed by the intruder about the other tenant's allocation, naming itself ...
      for (const kind of ['bound', 'failed', 'released'] as const)
        raw.send({ body: { $case: 'report', value: report(intruder.nodeId, kind) } });
      // ... and naming the node the allocation is on.
      raw.send({ body: { $case: 'report', value: report(target.node.nodeId, 'released') } });
      const refusals = await raw.wait(() => {
        const all = raw.received.flatMap((m) => (m.body?.$case === 'refusal' ? [m.body.value] : []));
        return all.length === 4 ? all : null;
      });
      expect(refusals.map((r) => r.code)).toEqual(['NOT_FOUND', 'NOT_FOUND', 'NOT_FOUND', 'INVALID_INPUT']);
      const acks = raw.received.flatMap((m) => (m.body?.$case === 'reportAck' ? [m.body.value] : []));
      expect(acks.map((a) => a.accepted)).toEqual([false, false, false, false]);
      expect(await snapshot()).toEqual(before);
      expect(fx.lifecycle.signals).toHaveLength(signals);
    } finally {
      raw.close();
    }
  });
});
