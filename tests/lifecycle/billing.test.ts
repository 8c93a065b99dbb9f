import { sql } from 'kysely';
import { describe, expect, it } from 'vitest';
import { endCurrentAllocations } from '../../db/reservations/lifecycle-release.ts';
import { checkBilling } from '../support/fault-checks.ts';
import { insertPlacedReservation, reportAllocation, useLifecycleHarness, waitForState } from './harness.ts';

// One-second usage windows stand in for hours.
const h = useLifecycleHarness({ name: 'billing', nodes: 1, timers: { usageWindowMs: 1_000 } });

describe('billing', () => {
  it('writes usage windows as the reservation runs, sends each once, and stops at the release', async () => {
    const { id, allocationId } = await insertPlacedReservation(h);
    await h.startLifecycle(id);
    await waitForState(h, id, 'binding');
    await reportAllocation(h, id, allocationId, 'bound');
    await waitForState(h, id, 'active');
    const sent = async () =>
      (
        await sql<{
          n: number;
        }>`SELECT count(*)::int AS n FROM usage_windows WHERE reservation_id = ${id} AND sent_at IS NOT NULL`.execute(
          h.db,
        )
      ).rows[0]!.n;
    // While it runs, closed windows are already in the ledger.
    await expect.poll(sent, { timeout: 30_000 }).toBeGreaterThanOrEqual(2);
    await h.lifecycle.signal(id, { type: 'release' });
    await waitForState(h, id, 'released');
    await h.temporal.client.workflow.getHandle(id).result();

    const windows = await h.db
      .selectFrom('usage_windows')
      .where('reservation_id', '=', id)
      .selectAll()
      .orderBy('hour_start')
      .execute();
    const { rows } = await sql<{ bound_at: Date; released_at: Date }>`
      SELECT bound_at, released_at FROM allocations WHERE id = ${allocationId}`.execute(h.db);
    const billedMs = rows[0]!.released_at.getTime() - rows[0]!.bound_at.getTime();
    const total = windows.reduce((sum, w) => sum + Number(w.quantity), 0);
    expect(total).toBeCloseTo((billedMs / 3_600_000) * 2, 5);
    expect(windows.every((w) => w.sent_at !== null && w.meter === 'gpu.h100.hours')).toBe(true);
    const ledger = await sql<{ n: number; keys: number }>`
      SELECT count(*)::int AS n, count(DISTINCT idempotency_key)::int AS keys FROM iam.usage_records
      WHERE subject = ${`reservation/${id}/allocation/${allocationId}`}`.execute(h.db);
    expect(ledger.rows[0]).toEqual({ n: windows.length, keys: windows.length });
    // Nothing is billed after the release.
    expect(Math.max(...windows.map((w) => w.hour_start.getTime()))).toBeLessThanOrEqual(
      rows[0]!.released_at.getTime(),
    );
  });

  it('never bills past a release whose transaction began before the window closed', async () => {
    const { id, allocationId } = await insertPlacedReservation(h);
    await h.startLifecycle(id);
    await waitForState(h, id, 'binding');
    await reportAllocation(h, id, allocationId, 'bound');
    await waitForState(h, id, 'active');
    const billedUntil = async () =>
      (
        await sql<{ until: Date | null }>`
          SELECT max(hour_start) + interval '1 second' AS until FROM usage_windows WHERE allocation_id = ${allocationId}`.execute(
          h.db,
        )
      ).rows[0]!.until?.getTime() ?? 0;
    const computeNow = async () =>
      (await sql<{ now: Date }>`SELECT compute_now() AS now`.execute(h.db)).rows[0]!.now.getTime();
    await expect.poll(billedUntil, { timeout: 30_000, interval: 100 }).toBeGreaterThan(0);
    // A release begins (its compute_now() is its start) and commits only after three more windows
    // closed, while the lifecycle goes on metering: those windows must wait for it.
    await h.db.transaction().execute(async (trx) => {
      const began = (
        await sql<{ now: Date }>`SELECT compute_now() AS now`.execute(trx)
      ).rows[0]!.now.getTime();
      await expect.poll(computeNow, { timeout: 30_000, interval: 100 }).toBeGreaterThan(began + 3_000);
      await expect
        .poll(billedUntil, { timeout: 30_000, interval: 100 })
        .toBeGreaterThanOrEqual(began - 1_000);
      expect(await billedUntil()).toBeLessThanOrEqual(began + 1_000);
      await endCurrentAllocations(trx, id, 'released');
    });
    await h.lifecycle.signal(id, { type: 'release' });
    await waitForState(h, id, 'released');
    await h.temporal.client.workflow.getHandle(id).result();
    const report = await checkBilling(h.db, 1_000);
    expect(report).toMatchObject({ overbilledAllocations: 0, overlappingWindows: 0 });
    expect(report.windows).toBeGreaterThan(0);
  });
});
