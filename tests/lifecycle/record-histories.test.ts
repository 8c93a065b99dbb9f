import { existsSync, writeFileSync } from 'node:fs';
import { describe, expect, it } from 'vitest';
import { historyToRecordedJson } from '../histories/format.ts';
import {
  insertPlacedReservation,
  insertUnplacedReservation,
  reportAllocation,
  useLifecycleHarness,
  waitForState,
} from './harness.ts';

/**
 * Records the histories the replay test guards, each only when its file is missing under
 * tests/histories/ (delete a file to record it again after an intended, patched change).
 */
const dir = new URL('../histories/', import.meta.url);
const scenarios = [
  'full-path',
  'lease-lapsed',
  'bind-retry',
  'confirmation-expired',
  'renewed-then-cancelled',
  // The full path again once the look became a local activity (patched 'observe-as-local-activity').
  'full-path-observed-locally',
  // And once the short steps became local activities too (patched 'lean-lifecycle').
  'full-path-lean',
];
const missing = scenarios.filter((name) => !existsSync(new URL(`${name}.json`, dir)));

describe.skipIf(missing.length === 0)('recording lifecycle histories', () => {
  const h = useLifecycleHarness({ name: 'record', nodes: 4 });

  async function save(name: string, reservationId: string): Promise<void> {
    const handle = h.temporal.client.workflow.getHandle(reservationId);
    await handle.result();
    writeFileSync(new URL(`${name}.json`, dir), `${historyToRecordedJson(await handle.fetchHistory())}\n`);
  }

  const start = (id: string, state: string) => h.startLifecycle(id, state);

  /** Placed, binding, bound, active, released. */
  async function fullPath(name: string): Promise<void> {
    const r = await insertPlacedReservation(h, { node: h.nodes[0]!, startInMs: 500 });
    await start(r.id, 'placed');
    await waitForState(h, r.id, 'binding');
    await reportAllocation(h, r.id, r.allocationId, 'bound');
    await waitForState(h, r.id, 'active');
    await h.lifecycle.signal(r.id, { type: 'release' });
    await save(name, r.id);
  }

  it('records every missing scenario', async () => {
    for (const name of ['full-path', 'full-path-observed-locally', 'full-path-lean'])
      if (missing.includes(name)) await fullPath(name);
    if (missing.includes('lease-lapsed')) {
      const r = await insertPlacedReservation(h, {
        node: h.nodes[1]!,
        startInMs: 3_600_000,
        leaseSeconds: 1,
      });
      await start(r.id, 'placed');
      await save('lease-lapsed', r.id);
    }
    if (missing.includes('bind-retry')) {
      const r = await insertPlacedReservation(h, { node: h.nodes[2]! });
      await start(r.id, 'placed');
      await waitForState(h, r.id, 'binding');
      await reportAllocation(h, r.id, r.allocationId, 'failed');
      await waitForState(h, r.id, 'pending');
      await h.lifecycle.signal(r.id, { type: 'cancel' }).catch(() => {});
      await save('bind-retry', r.id);
    }
    if (missing.includes('confirmation-expired')) {
      const id = await insertUnplacedReservation(h, {
        state: 'awaiting-confirmation',
        confirmationExpiresInMs: 1_000,
      });
      await start(id, 'awaiting-confirmation');
      await save('confirmation-expired', id);
    }
    if (missing.includes('renewed-then-cancelled')) {
      const r = await insertPlacedReservation(h, {
        node: h.nodes[3]!,
        startInMs: 3_600_000,
        leaseSeconds: 60,
      });
      await start(r.id, 'placed');
      await waitForState(h, r.id, 'placed');
      await new Promise((resolve) => setTimeout(resolve, 500));
      await h.lifecycle.renew(r.id);
      await h.lifecycle.signal(r.id, { type: 'cancel' });
      await save('renewed-then-cancelled', r.id);
    }
    for (const name of scenarios) expect(existsSync(new URL(`${name}.json`, dir))).toBe(true);
  });
});
