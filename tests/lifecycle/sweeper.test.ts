import { spawn } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';
import { checkBookingInvariants } from '../../db/allocations/invariants.ts';
import { recordLifecycleWake } from '../../db/reservations/lifecycle-wakes.ts';
import { releaseReservation } from '../../db/reservations/reservations.ts';
import { bootstrapPlatform } from '../../iam/bootstrap.ts';
import { createEmbeddedIam } from '../../iam/embedded/index.ts';
import { ensureSweeperSchedule } from '../../temporal/schedules.ts';
import { tenantMember } from '../support/iam.ts';
import { testLogger } from '../support/logger.ts';
import {
  insertPlacedReservation,
  insertUnplacedReservation,
  useLifecycleHarness,
  waitForState,
  wakeReasons,
} from './harness.ts';

const h = useLifecycleHarness({ name: 'sweeper', nodes: 2, sweeper: { everyMs: 1_000, graceMs: 500 } });

/** Until the reservation's lifecycle has looked at it once. */
async function waitForStarted(reservationId: string) {
  await expect
    .poll(
      async () =>
        (
          await h.db
            .selectFrom('reservations')
            .where('id', '=', reservationId)
            .select('lifecycle_started_at')
            .executeTakeFirstOrThrow()
        ).lifecycle_started_at,
      { timeout: 20_000 },
    )
    .not.toBeNull();
}

describe('the orphan sweeper (a Temporal Schedule)', () => {
  it('starts the lifecycle of reservations committed without one (the API died before the start)', async () => {
    const placed = await insertPlacedReservation(h, { node: h.nodes[0]! });
    const waiting = await insertUnplacedReservation(h, {
      state: 'awaiting-confirmation',
      confirmationExpiresInMs: 60_000,
    });
    await waitForState(h, placed.id, 'binding', 20_000);
    await expect
      .poll(async () => (await h.temporal.client.workflow.getHandle(waiting).describe()).status.name, {
        timeout: 30_000,
      })
      .toBe('RUNNING');
    const row = await h.db
      .selectFrom('reservations')
      .where('id', '=', placed.id)
      .select('lifecycle_started_at')
      .executeTakeFirstOrThrow();
    expect(row.lifecycle_started_at).not.toBeNull();
    await h.lifecycle.signal(placed.id, { type: 'release' });
    await h.lifecycle.signal(waiting, { type: 'cancel' });
    await waitForState(h, placed.id, 'released');
    await waitForState(h, waiting, 'cancelled');
  }, 150_000);

  it('restarts the lifecycle of a live reservation whose workflow was terminated', async () => {
    const placed = await insertPlacedReservation(h, { node: h.nodes[1]!, startInMs: 3_600_000 });
    await h.startLifecycle(placed.id);
    const handle = h.temporal.client.workflow.getHandle(placed.id);
    await waitForStarted(placed.id);
    const firstRun = (await handle.describe()).runId;
    await handle.terminate('an operator pressed the wrong button');
    await expect
      .poll(
        async () => {
          const d = await h.temporal.client.workflow.getHandle(placed.id).describe();
          return d.status.name === 'RUNNING' && d.runId !== firstRun;
        },
        { timeout: 20_000, interval: 250 },
      )
      .toBe(true);
    await h.lifecycle.signal(placed.id, { type: 'cancel' });
    expect((await waitForState(h, placed.id, 'cancelled')).end_reason).toBe('cancel');
  });

  it("catches up after an API process is SIGKILLed between admission's commit and the workflow start", async () => {
    const iam = createEmbeddedIam({ db: h.db, log: testLogger() });
    await bootstrapPlatform(iam);
    const { token } = await tenantMember(iam, 'acme', { name: 'ada' });
    const child = spawn(
      process.execPath,
      [
        '--import',
        'tsx',
        fileURLToPath(new URL('./api-crash-child.ts', import.meta.url)),
        JSON.stringify({ databaseUrl: h.t.url, token, poolId: h.poolId }),
      ],
      { stdio: ['ignore', 'pipe', 'inherit'] },
    );
    let output = '';
    child.stdout.on('data', (chunk: Buffer) => {
      output += chunk.toString();
    });
    const signal = await new Promise((resolve) => child.once('exit', (_code, sig) => resolve(sig)));
    expect(signal).toBe('SIGKILL');
    expect(output).toBe('');
    const row = await h.db
      .selectFrom('reservations')
      .where('idempotency_key', '=', 'crash-between-commit-and-start')
      .select(['id', 'state'])
      .executeTakeFirstOrThrow();
    expect(row.state).toBe('placed');
    await waitForState(h, row.id, 'binding', 20_000);
    expect(await checkBookingInvariants(h.db)).toEqual({ deviceOverlaps: 0, scalarOverbookings: 0 });
    await h.lifecycle.signal(row.id, { type: 'release' });
    await waitForState(h, row.id, 'released');
  });

  it('wakes the lifecycle of a reservation whose release committed but never told it (the API died)', async () => {
    const placed = await insertPlacedReservation(h, { node: h.nodes[1]!, startInMs: 3_600_000 });
    await h.startLifecycle(placed.id);
    const handle = h.temporal.client.workflow.getHandle(placed.id);
    await waitForStarted(placed.id);
    // What a caller's release leaves when its process dies right after the commit.
    await h.db.transaction().execute(async (trx) => {
      await releaseReservation(trx, placed.id, 'release');
      await recordLifecycleWake(trx, placed.id, 'release');
    });
    expect(await handle.result()).toEqual({ state: 'released' });
    const wakes = await wakeReasons(h, placed.id);
    expect(wakes).toContainEqual(expect.stringContaining('sweeper: release'));
    await expect
      .poll(() =>
        h.db.selectFrom('lifecycle_wakes').where('reservation_id', '=', placed.id).selectAll().execute(),
      )
      .toEqual([]);
  });

  it('ensures its Schedule idempotently and brings an existing one to the new settings', async () => {
    const scheduleId = `sweeper-ensure-${h.taskQueue}`;
    try {
      await ensureSweeperSchedule(h.temporal.client, { taskQueue: h.taskQueue, everyMs: 60_000, scheduleId });
      await ensureSweeperSchedule(h.temporal.client, { taskQueue: h.taskQueue, everyMs: 60_000, scheduleId });
      await ensureSweeperSchedule(h.temporal.client, {
        taskQueue: `${h.taskQueue}-2`,
        everyMs: 30_000,
        scheduleId,
      });
      const described = await h.temporal.client.schedule.getHandle(scheduleId).describe();
      expect(described.action).toMatchObject({ type: 'startWorkflow', taskQueue: `${h.taskQueue}-2` });
      expect(described.spec.intervals?.[0]?.every).toBe(30_000);
    } finally {
      await h.temporal.client.schedule.getHandle(scheduleId).delete();
    }
  });
});
