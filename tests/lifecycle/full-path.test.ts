import { sql } from 'kysely';
import { describe, expect, it } from 'vitest';
import { searchAttributes } from '../../workflows/search-attributes.ts';
import {
  eventTypes,
  insertPlacedReservation,
  quotaRefunded,
  reportAllocation,
  useLifecycleHarness,
  waitForState,
} from './harness.ts';

const h = useLifecycleHarness({ name: 'full-path' });

describe('a reservation lifecycle on Temporal', () => {
  it('goes placed → binding → active → released, with NodeSpec, events, billing and search attributes', async () => {
    const { id, allocationId } = await insertPlacedReservation(h, {
      startInMs: 1_500,
      durationMs: 3_600_000,
    });
    await h.startLifecycle(id);
    await h.startLifecycle(id); // harmless twice

    await waitForState(h, id, 'binding');
    const node = await h.db
      .selectFrom('nodes')
      .where('id', '=', h.nodes[0]!.id)
      .select(['spec', 'spec_generation'])
      .executeTakeFirstOrThrow();
    const devices = (node.spec as { devices: Array<{ allocationId: string; deviceIds: string[] }> }).devices;
    expect(devices).toHaveLength(1);
    expect(devices[0]!.allocationId).toBe(allocationId);
    expect(devices[0]!.deviceIds.sort()).toEqual([...h.nodes[0]!.deviceIds].sort());
    expect(Number(node.spec_generation)).toBe(2);

    await reportAllocation(h, id, allocationId, 'bound');
    await waitForState(h, id, 'active');

    const handle = h.temporal.client.workflow.getHandle(id);
    await expect
      .poll(async () => (await handle.describe()).typedSearchAttributes.get(searchAttributes.state), {
        timeout: 20_000,
      })
      .toBe('active');
    const described = await handle.describe();
    expect(described.typedSearchAttributes.get(searchAttributes.tenant)).toBe('acme');
    expect(await described.memo).toMatchObject({ tenantId: 'acme', poolId: h.poolId });

    // Active for a while, so the usage window below holds more than nothing.
    await new Promise((r) => setTimeout(r, 1_000));
    await h.lifecycle.signal(id, { type: 'release' });
    const released = await waitForState(h, id, 'released');
    expect(released.end_reason).toBe('release');
    expect(await eventTypes(h, id)).toEqual([
      'reservation.binding',
      'reservation.active',
      'reservation.released',
    ]);

    // Bookings end at the release, the NodeSpec loses the assignment, quota comes back.
    const { rows } = await sql<{ ended: boolean }>`
      SELECT bool_and(upper(during) <= compute_now()) AS ended FROM device_bookings WHERE allocation_id = ${allocationId}`.execute(
      h.db,
    );
    expect(rows[0]!.ended).toBe(true);
    const after = await h.db
      .selectFrom('nodes')
      .where('id', '=', h.nodes[0]!.id)
      .select('spec')
      .executeTakeFirstOrThrow();
    expect((after.spec as { devices: unknown[] }).devices).toEqual([]);
    expect(await quotaRefunded(h, id)).toBe(true);

    // Billing: the seconds it was active (not the booked hour; a loaded machine may stretch those
    // seconds to a minute), in one window or two when they cross the hour, each sent once to the
    // IAM ledger.
    expect(await handle.result()).toEqual({ state: 'released' });
    const windows = await h.db
      .selectFrom('usage_windows')
      .where('reservation_id', '=', id)
      .selectAll()
      .execute();
    expect(windows.length).toBeGreaterThanOrEqual(1);
    expect(windows.length).toBeLessThanOrEqual(2);
    const billed = windows.reduce((sum, w) => sum + Number(w.quantity), 0);
    expect(billed).toBeGreaterThan(0);
    expect(billed).toBeLessThan(0.1);
    for (const w of windows) {
      expect(w.meter).toBe('gpu.h100.hours');
      expect(w.sent_at).not.toBeNull();
    }
    const ledger = await sql<{
      n: number;
    }>`SELECT count(*)::int AS n FROM iam.usage_records WHERE idempotency_key = ANY(${windows.map((w) => w.idempotency_key)})`.execute(
      h.db,
    );
    expect(ledger.rows[0]!.n).toBe(windows.length);

    // A release of a terminal reservation is INVALID_STATE and changes nothing.
    await expect(h.lifecycle.signal(id, { type: 'release' })).rejects.toMatchObject({
      code: 'INVALID_STATE',
    });
  });
});
