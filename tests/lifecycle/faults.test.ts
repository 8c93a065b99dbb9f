import type { ChildProcess } from 'node:child_process';
import { sql } from 'kysely';
import pg from 'pg';
import { afterAll, describe, expect, it, vi } from 'vitest';
import { checkBookingInvariants } from '../../db/allocations/invariants.ts';
import { waitForSessionsOnLock } from '../support/database.ts';
import { killChild, spawnChildWorker } from './children.ts';
import {
  eventTypes,
  insertPlacedReservation,
  reportAllocation,
  useLifecycleHarness,
  waitForState,
} from './harness.ts';

// Each test starts a worker in a child process and waits for it several times over; on a loaded
// machine that alone can take most of a minute.
vi.setConfig({ testTimeout: 180_000 });

const activityTimeoutMs = 3_000;
const h = useLifecycleHarness({
  name: 'faults',
  nodes: 2,
  worker: false,
  activityTimeoutMs,
  timers: { bindTimeoutMs: 60_000 },
});
let child: ChildProcess | null = null;

afterAll(async () => {
  if (child) await killChild(child);
});

/** Waits until some session of the test database waits on a lock (the child's activity is stuck). */
const waitForBlockedSession = () => waitForSessionsOnLock(h.db, 'worker-child');

describe('faults', () => {
  it('a worker SIGKILLed in the middle of an activity: the step runs once on the next worker', async () => {
    child = await spawnChildWorker(h, { activityTimeoutMs });
    const { id } = await insertPlacedReservation(h, { node: h.nodes[0]! });
    // Hold the reservation's row lock, so the child's beginBinding blocks inside its transaction.
    const blocker = new pg.Client({ connectionString: h.t.url });
    await blocker.connect();
    await blocker.query('BEGIN');
    await blocker.query('SELECT 1 FROM reservations WHERE id = $1 FOR UPDATE', [id]);
    await h.startLifecycle(id);
    await waitForBlockedSession();
    await killChild(child);
    child = null;
    await blocker.query('ROLLBACK');
    await blocker.end();

    await h.startWorker();
    await waitForState(h, id, 'binding', 30_000);
    expect(await eventTypes(h, id)).toEqual(['reservation.binding']);
    const node = await h.db
      .selectFrom('nodes')
      .where('id', '=', h.nodes[0]!.id)
      .select('spec_generation')
      .executeTakeFirstOrThrow();
    expect(Number(node.spec_generation)).toBe(2);
    await h.lifecycle.signal(id, { type: 'release' });
    await waitForState(h, id, 'released');
    expect(await checkBookingInvariants(h.db)).toEqual({ deviceOverlaps: 0, scalarOverbookings: 0 });
    await h.worker!.stop();
    h.worker = null;
  });

  it('a worker SIGKILLed after billing recorded usage but before marking it sent: billed once', async () => {
    child = await spawnChildWorker(h, { activityTimeoutMs });
    const { id, allocationId } = await insertPlacedReservation(h, { node: h.nodes[1]! });
    await h.startLifecycle(id);
    await waitForState(h, id, 'binding', 30_000);
    await reportAllocation(h, id, allocationId, 'bound');
    await waitForState(h, id, 'active', 30_000);

    // Marking windows sent waits on an advisory lock the test holds: the ledger write has committed.
    await sql`
      CREATE FUNCTION wait_for_test_gate() RETURNS trigger LANGUAGE plpgsql AS $$
      BEGIN PERFORM pg_advisory_xact_lock_shared(4242); RETURN NEW; END $$;
      CREATE TRIGGER usage_sent_gate BEFORE UPDATE ON usage_windows FOR EACH ROW EXECUTE FUNCTION wait_for_test_gate();
    `.execute(h.db);
    const gate = new pg.Client({ connectionString: h.t.url });
    await gate.connect();
    await gate.query('SELECT pg_advisory_lock(4242)');
    await h.lifecycle.signal(id, { type: 'release' }).catch(() => {});
    await waitForBlockedSession();
    const recorded = await sql<{
      n: number;
    }>`SELECT count(*)::int AS n FROM iam.usage_records WHERE subject LIKE ${`reservation/${id}/%`}`.execute(
      h.db,
    );
    // One window, or two when the seconds it was active cross the hour.
    const windows = await h.db
      .selectFrom('usage_windows')
      .where('reservation_id', '=', id)
      .select(sql<number>`count(*)::int`.as('n'))
      .executeTakeFirstOrThrow();
    expect(windows.n).toBeGreaterThanOrEqual(1);
    expect(recorded.rows[0]!.n).toBe(windows.n);
    await killChild(child);
    child = null;
    await gate.query('SELECT pg_advisory_unlock(4242)');
    await gate.end();

    await h.startWorker();
    await expect
      .poll(
        async () =>
          (
            await h.db
              .selectFrom('usage_windows')
              .where('reservation_id', '=', id)
              .where('sent_at', 'is', null)
              .select(sql<number>`count(*)::int`.as('n'))
              .executeTakeFirstOrThrow()
          ).n,
        { timeout: 30_000 },
      )
      .toBe(0);
    const ledger = await sql<{
      n: number;
    }>`SELECT count(*)::int AS n FROM iam.usage_records WHERE subject LIKE ${`reservation/${id}/%`}`.execute(
      h.db,
    );
    expect(ledger.rows[0]!.n).toBe(windows.n);
    expect((await waitForState(h, id, 'released')).end_reason).toBe('release');
    expect(await h.temporal.client.workflow.getHandle(id).result()).toEqual({ state: 'released' });
    expect(await checkBookingInvariants(h.db)).toEqual({ deviceOverlaps: 0, scalarOverbookings: 0 });
  });
});
