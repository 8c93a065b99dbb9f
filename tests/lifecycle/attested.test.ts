import { generateKeyPairSync } from 'node:crypto';
import { sql } from 'kysely';
import { beforeAll, describe, expect, it } from 'vitest';
import { signAllocationReport } from '../../domain/attestation.ts';
import { keyIdOfPublicKey } from '../../domain/pki.ts';
import { acceptAllocationReport } from '../../gateway/reports.ts';
import { testLogger } from '../support/logger.ts';
import {
  eventTypes,
  insertPlacedReservation,
  reservationConditions,
  useLifecycleHarness,
  waitForState,
} from './harness.ts';

/**
 * Attested bindings through the gateway's real storage path (acceptAllocationReport) and the
 * worker's verification: only a report the node signed counts as bound.
 */
const h = useLifecycleHarness({ name: 'attested', nodes: 2, timers: { bindTimeoutMs: 30_000 } });
const log = testLogger();
const keys = new Map<string, string>();

beforeAll(async () => {
  for (const node of h.nodes) {
    const { publicKey, privateKey } = generateKeyPairSync('ec', { namedCurve: 'P-256' });
    const publicKeyPem = publicKey.export({ format: 'pem', type: 'spki' }).toString();
    keys.set(node.id, privateKey.export({ format: 'pem', type: 'pkcs8' }).toString());
    await h.db
      .insertInto('node_certificates')
      .values({
        serial: `serial-${node.id}`,
        node_id: node.id,
        role: 'node',
        spiffe_id: `spiffe://test/node/${node.id}`,
        key_id: keyIdOfPublicKey(publicKeyPem),
        public_key_pem: publicKeyPem,
        certificate_pem: 'test certificate',
        not_before: new Date(Date.now() - 60_000),
        not_after: new Date(Date.now() + 3_600_000),
      })
      .execute();
  }
});

async function report(nodeId: string, allocationId: string, signWith: string | null) {
  const uuids = (
    await h.db
      .selectFrom('device_bookings as b')
      .innerJoin('devices as d', 'd.id', 'b.device_id')
      .where('b.allocation_id', '=', allocationId)
      .select('d.stable_id')
      .execute()
  ).map((r) => r.stable_id);
  const body = {
    purpose: 'attested-report',
    nodeId,
    allocationId,
    specGeneration: 2,
    atMs: Date.now(),
    kind: {
      $case: 'bound' as const,
      value: {
        cdiDevices: uuids.map((u) => `bcd.dev/gpu=${u}`),
        envFile: `/run/bcd/allocations/${allocationId}.env`,
        cdiSpecFile: `/etc/cdi/bcd-${allocationId}.json`,
        cgroupParent: '',
        gpuUuids: uuids,
      },
    },
  };
  const signed = signWith
    ? signAllocationReport(body, signWith)
    : { body: signAllocationReport(body, keys.get(nodeId)!).body, keyId: '', signature: Buffer.alloc(0) };
  const node = await h.db
    .selectFrom('nodes')
    .where('id', '=', nodeId)
    .select('epoch')
    .executeTakeFirstOrThrow();
  await acceptAllocationReport(
    { db: h.db, log, lifecycle: h.lifecycle },
    { nodeId, epoch: Number(node.epoch), report: signed },
  );
}

describe('attested bindings', () => {
  it('activates only on the node-signed report; an unsigned one is rejected and changes nothing', async () => {
    const node = h.nodes[0]!;
    const { id, allocationId } = await insertPlacedReservation(h, { node });
    await h.startLifecycle(id);
    await waitForState(h, id, 'binding');

    await report(node.id, allocationId, null);
    await expect.poll(() => eventTypes(h, id), { timeout: 20_000 }).toContain('reservation.binding-rejected');
    expect((await waitForState(h, id, 'binding')).state).toBe('binding');

    await report(node.id, allocationId, keys.get(node.id)!);
    await waitForState(h, id, 'active');
    const allocation = await h.db
      .selectFrom('allocations')
      .where('id', '=', allocationId)
      .selectAll()
      .executeTakeFirstOrThrow();
    expect(allocation.attested).toBe(true);
    expect(allocation.binding).toMatchObject({ envFile: `/run/bcd/allocations/${allocationId}.env` });
  });

  it('marks an active reservation Degraded/BindingLost when a forged re-report arrives', async () => {
    const node = h.nodes[1]!;
    const { id, allocationId } = await insertPlacedReservation(h, { node });
    await h.startLifecycle(id);
    await waitForState(h, id, 'binding');
    await report(node.id, allocationId, keys.get(node.id)!);
    await waitForState(h, id, 'active');

    // Signed by the other node's key: not this node's binding.
    await report(node.id, allocationId, keys.get(h.nodes[0]!.id)!);
    await expect
      .poll(() => reservationConditions(h, id), {
        timeout: 20_000,
      })
      .toContainEqual(expect.objectContaining({ type: 'Degraded', reason: 'BindingLost' }));
    expect((await waitForState(h, id, 'active')).state).toBe('active');
    const { rows } = await sql<{ n: number }>`
      SELECT count(*)::int AS n FROM outbox_events WHERE type = 'reservation.binding-rejected' AND subject = ${`reservation/${id}`}`.execute(
      h.db,
    );
    expect(rows[0]!.n).toBe(1);
    await h.lifecycle.signal(id, { type: 'release' });
    await waitForState(h, id, 'released');
  });
});
