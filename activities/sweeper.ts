import type { Db } from '../core/database.ts';
import type { ReservationLifecycle } from '../core/deps.ts';
import type { Logger } from '../core/logger.ts';
import { announceExpiredHolds, retireEndedHolds } from '../db/holds/holds.ts';
import { findUnfinishedDrains, finishDrains } from '../db/nodes/drains.ts';
import { findSweepCandidates } from '../db/reservations/lifecycle.ts';
import { clearLifecycleWake, findOwedLifecycleWakes } from '../db/reservations/lifecycle-wakes.ts';
import { findOpenPreemptions } from '../db/reservations/preemption.ts';

export interface SweeperActivityDeps {
  db: Db;
  log: Logger;
  lifecycle: ReservationLifecycle;
}

/**
 * The orphan sweep: no non-terminal reservation may exist without its workflow (DESIGN.md
 * principle 3). It reads, in one read-only transaction, the live reservations older than `graceMs`,
 * lists the running lifecycles from Temporal's visibility, and signal-with-starts every
 * reservation that has none (harmless when visibility lags and one does run); likewise the
 * workflow of every open spot preemption notice.
 */
export function createSweeperActivities({ db, log, lifecycle }: SweeperActivityDeps) {
  return {
    /** Capacity was freed in a pool (a lifecycle released bookings): its pending reservations try now. */
    async wakePoolPending(input: { poolId: string }): Promise<void> {
      await lifecycle.wakePool(input.poolId);
    },

    /**
     * Announces every host hold that lapsed without a release (`hold.expired`, once each, at most
     * `limit` a run; the next run goes on), then retires ended holds past the hour they stay listed.
     */
    async sweepExpiredHolds(input: { limit: number }): Promise<{ expired: string[]; retired: number }> {
      return db.transaction().execute(async (trx) => {
        const expired = await announceExpiredHolds(trx, { limit: input.limit });
        const retired = await retireEndedHolds(trx);
        if (expired.length > 0) log.info({ expired }, 'host holds expired (no heartbeat within their TTL)');
        return { expired, retired };
      });
    },

    /**
     * The safety net under finished drains: every draining node whose drain has not finished is
     * checked again (`finishDrains`, level-triggered), at most `limit` a run, in one transaction.
     */
    async sweepUnfinishedDrains(input: { limit: number }): Promise<{ drained: string[] }> {
      const candidates = await findUnfinishedDrains(db, input.limit);
      if (candidates.length === 0) return { drained: [] };
      const drained = await db.transaction().execute((trx) => finishDrains(trx, candidates));
      if (drained.length > 0) log.info({ drained }, 'drains finished by the sweep');
      return { drained };
    },

    async sweepOrphanReservations(input: { graceMs: number; limit: number }): Promise<{ started: string[] }> {
      const candidates = await findSweepCandidates(db, input);
      if (candidates.length === 0) return { started: [] };
      const running = await lifecycle.running(candidates.map((r) => r.id));
      const orphans = candidates.filter((r) => r.lifecycle_started_at === null || !running.has(r.id));
      const started: string[] = [];
      for (const r of orphans) {
        await lifecycle.start(
          { id: r.id, tenantId: r.tenant_id, poolId: r.pool_id, state: r.state },
          'sweeper',
        );
        started.push(r.id);
      }
      if (started.length > 0) log.warn({ started }, 'started lifecycles of orphaned reservations');
      return { started };
    },

    /**
     * Sends the wakes callers' releases and cancels still owe their lifecycles `graceMs` after
     * their commit (the API died before it told the workflow, or Temporal did not answer): each
     * running lifecycle looks again and finishes; one that has finished is left alone. At most
     * `limit` a run; the next run goes on.
     */
    async sweepOwedLifecycleWakes(input: { graceMs: number; limit: number }): Promise<{ woken: string[] }> {
      const owed = await findOwedLifecycleWakes(db, input);
      const woken: string[] = [];
      for (const wake of owed) {
        await lifecycle.signal(wake.reservation_id, {
          type: 'wake',
          reason: `sweeper: ${wake.reason}`,
          ifRunning: true,
        });
        await clearLifecycleWake(db, wake.reservation_id);
        woken.push(wake.reservation_id);
      }
      if (woken.length > 0) log.warn({ woken }, 'woke lifecycles a release or cancel had not told');
      return { woken };
    },

    /**
     * Starts the workflow of every open spot preemption notice older than `graceMs` whose
     * `spotPreemption` workflow is not running (the placement committed, then the process died
     * before the start). Harmless when one runs: the start is refused by its id.
     */
    async sweepOrphanPreemptions(input: { graceMs: number; limit: number }): Promise<{ started: string[] }> {
      if (!lifecycle.preempt) return { started: [] };
      const open = await findOpenPreemptions(db, input);
      const started: string[] = [];
      for (const preemption of open) {
        if ((await lifecycle.preempt(preemption)) !== false) started.push(preemption.id);
      }
      if (started.length > 0) log.warn({ started }, 'started workflows of orphaned spot preemptions');
      return { started };
    },
  };
}

export type SweeperActivities = ReturnType<typeof createSweeperActivities>;
