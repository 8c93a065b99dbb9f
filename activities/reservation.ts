import type { Transaction } from 'kysely';
import type { Database, Db } from '../core/database.ts';
import type { Logger } from '../core/logger.ts';
import { lockCurrentAllocations, startBindingAllocations } from '../db/allocations/lifecycle.ts';
import { recordCapacityFailure } from '../db/holds/demand.ts';
import { holdMachinesForCleaning, startMachineDeploys } from '../db/metal/dedicated-leases.ts';
import {
  lockReservationAtVersion,
  markLifecycleStarted,
  readReservationSnapshot,
  updateReservation,
} from '../db/reservations/lifecycle.ts';
import { recordReservationEvent } from '../db/reservations/lifecycle-events.ts';
import { assignReservationDevices } from '../db/reservations/lifecycle-nodespec.ts';
import { endCurrentAllocations, refundReservationQuota } from '../db/reservations/lifecycle-release.ts';
import { callOffPreemptionsBy } from '../db/reservations/preemption-call-off.ts';
import { beginKubernetesRelease } from '../db/reservations/releasing.ts';
import { lockReservation } from '../db/reservations/reservations.ts';
import { isCapacityFailure } from '../domain/demand.ts';
import { ComputeError } from '../domain/errors.ts';
import { terminalEventTypes } from '../domain/event-types.ts';
import type { Condition, LifecycleTimers, ReservationSnapshot } from '../domain/reservation-lifecycle.ts';
import { isRenewable, isTerminal, type TerminalState } from '../domain/reservation-states.ts';
import { createMachineLeaseActivities } from './dedicated-root.ts';
import { asActivity } from './failure.ts';
import { createKubernetesReleaseActivities } from './kubernetes-release.ts';

export interface ReservationActivityDeps {
  db: Db;
  log: Logger;
}

/** What a guarded step answers: whether it changed anything, and the state it left. */
export interface StepResult {
  applied: boolean;
  state: string | null;
  /**
   * The reservation as the step left it, read in the step's own transaction, when the caller asked
   * for it (`look`) and the step applied: the lifecycle's next look, without a transaction of its own.
   */
  snapshot?: ReservationSnapshot | null;
}

/** A step's guard, and whether the caller wants the reservation read after it (its timers then). */
interface StepGuard {
  reservationId: string;
  expectedVersion: number;
  look?: { timers?: Partial<LifecycleTimers> | undefined };
}

/**
 * The lifecycle's steps. Each is one PostgreSQL transaction, guarded by the reservation's state
 * and version (a step whose version moved on changes nothing and answers `applied: false`), so
 * Temporal's at-least-once retries are safe. Every change writes its outbox event in the same
 * transaction.
 */
export function createReservationActivities({ db, log }: ReservationActivityDeps) {
  /**
   * One guarded step in its own transaction: the reservation locked at `expectedVersion`; `step`
   * runs only when it is still there and `applies` to it, otherwise nothing changes.
   */
  function guardedStep(
    input: StepGuard,
    applies: (row: LockedReservation) => boolean,
    step: (trx: Trx, row: LockedReservation) => Promise<StepResult>,
  ): Promise<StepResult> {
    return asActivity(() =>
      db.transaction().execute(async (trx) => {
        const row = await lockReservationAtVersion(trx, input.reservationId, input.expectedVersion);
        if (!row || !applies(row)) return { applied: false, state: row?.state ?? null };
        const result = await step(trx, row);
        if (!input.look || !result.applied) return result;
        return { ...result, snapshot: await readReservationSnapshot(trx, row.id, input.look.timers) };
      }),
    );
  }

  return {
    // A held kubernetes release's steps (carry, finish) run in the same lifecycle.
    ...createKubernetesReleaseActivities({ db, log }),
    // A dedicated-root lease's deploys are judged in the same lifecycle.
    ...createMachineLeaseActivities({ db, log }),

    /**
     * Reads the truth (level-triggered: every wake-up starts here) and marks the lifecycle started.
     * Null when the reservation does not exist.
     */
    async observeReservation(input: {
      reservationId: string;
      timers?: Partial<LifecycleTimers>;
    }): Promise<ReservationSnapshot | null> {
      return db.transaction().execute(async (trx) => {
        await markLifecycleStarted(trx, input.reservationId);
        return readReservationSnapshot(trx, input.reservationId, input.timers);
      });
    },

    /**
     * At the start: `placed` → `binding`, each allocation gains its NodeSpec `devices` assignment
     * (a new generation of its node's spec) and the bind deadline is recorded.
     */
    async beginBinding(input: StepGuard & { bindDeadline: number }): Promise<StepResult> {
      return guardedStep(
        input,
        (row) => row.state === 'placed',
        async (trx, row) => {
          await startBindingAllocations(trx, row.id);
          // Dedicated root: the lease's profile is deployed on each machine instead of a NodeSpec.
          const nodeIds =
            row.binding_kind === 'node'
              ? await startMachineDeploys(trx, row)
              : await assignReservationDevices(trx, row.id, bindingOf(row));
          await updateReservation(trx, row.id, {
            state: 'binding',
            bindDeadline: new Date(input.bindDeadline),
          });
          await recordReservationEvent(trx, row, 'reservation.binding', 'binding', {
            nodeIds,
            bindDeadline: input.bindDeadline,
            attempt: row.bind_attempts + 1,
          });
          log.info({ reservationId: row.id, nodes: nodeIds.length }, 'binding');
          return { applied: true, state: 'binding' };
        },
      );
    },

    /**
     * Brings the nodes' `devices` assignments in line with the allocations' ends (after an extend
     * moved them). Idempotent: a node whose spec already says so keeps its generation.
     */
    async syncAssignments(input: { reservationId: string; expectedVersion: number }): Promise<StepResult> {
      return guardedStep(
        input,
        (row) => row.state === 'binding' || row.state === 'active',
        async (trx, row) => {
          await assignReservationDevices(trx, row.id, bindingOf(row));
          return { applied: true, state: row.state };
        },
      );
    },

    /** Every allocation reported bound: `binding` → `active` (billing runs from each `bound_at`). */
    async activateReservation(input: StepGuard): Promise<StepResult> {
      return guardedStep(
        input,
        (row) => row.state === 'binding',
        async (trx, row) => {
          const allocations = await lockCurrentAllocations(trx, row.id);
          if (allocations.length === 0 || allocations.some((a) => a.state !== 'bound')) {
            return { applied: false, state: row.state };
          }
          const conditions = conditionsWithout(row, 'BindTimeout');
          await updateReservation(trx, row.id, { state: 'active', conditions, bindDeadline: null });
          await recordReservationEvent(trx, row, 'reservation.active', 'active', {
            allocations: allocations.map((a) => ({
              allocationId: a.id,
              nodeId: a.node_id,
              binding: a.binding,
            })),
          });
          return { applied: true, state: 'active' };
        },
      );
    },

    /**
     * A binding attempt failed (no report in time, or the node refused): the bookings are released,
     * the NodeSpec assignments withdrawn, the failure counted in a `BindTimeout` condition, and the
     * reservation goes back to `pending` to be placed again at once.
     */
    async rebindReservation(input: {
      reservationId: string;
      expectedVersion: number;
      reason: string;
      message: string;
    }): Promise<StepResult> {
      return guardedStep(
        input,
        (row) => row.state === 'binding',
        async (trx, row) => {
          const ended = await endCurrentAllocations(trx, row.id, 'failed');
          const conditions = [
            ...conditionsWithout(row, 'BindTimeout'),
            { type: 'BindTimeout', reason: input.reason, message: input.message },
          ];
          await updateReservation(trx, row.id, {
            state: 'pending',
            conditions,
            bindAttempts: row.bind_attempts + 1,
            bindDeadline: null,
            pendingSinceNow: true,
          });
          await recordReservationEvent(trx, row, 'reservation.pending', 'pending', {
            reason: input.reason,
            message: input.message,
            releasedAllocations: ended.map((a) => a.id),
          });
          log.warn(
            { reservationId: row.id, reason: input.reason, attempt: row.bind_attempts + 1 },
            'binding failed',
          );
          return { applied: true, state: 'pending' };
        },
      );
    },

    /**
     * Ends a reservation: `released` (with reason `release`, `expired` or `lease-lapsed`),
     * `cancelled`, `failed` (with its condition), `expired` or `denied`. Bookings are truncated at
     * compute_now(), quota refunded once, NodeSpec assignments withdrawn, the event written.
     */
    async endReservation(
      input: StepGuard & { state: TerminalState; reason: string; condition?: Condition },
    ): Promise<StepResult> {
      return guardedStep(
        input,
        (row) => !isTerminal(row.state),
        async (trx, row) => {
          // A kubernetes binding whose pods may hold its GPUs is releasing until the node reports them free.
          if (input.state === 'released' && (await beginKubernetesRelease(trx, row, input.reason))) {
            return { applied: true, state: 'releasing' };
          }
          // Dedicated root: deployed machines keep their bookings until they are wiped.
          if (row.binding_kind === 'node') await holdMachinesForCleaning(trx, row);
          await endCurrentAllocations(trx, row.id, 'released');
          await refundReservationQuota(trx, row.id);
          // Ended during the notice it gave (e.g. its pool archived): the spot ones keep their capacity.
          if (!row.spot) await callOffPreemptionsBy(trx, row.id);
          const conditions = input.condition
            ? [...conditionsWithout(row, input.condition!.type), input.condition]
            : undefined;
          await updateReservation(trx, row.id, {
            state: input.state,
            endReason: input.reason,
            endWindowNow: input.state === 'released',
            bindDeadline: null,
            ...(conditions ? { conditions } : {}),
          });
          // A spot reservation released at its preemption deadline says so (reservation.preempted).
          const type =
            input.reason === 'preempted' ? 'reservation.preempted' : terminalEventTypes[input.state];
          await recordReservationEvent(trx, row, type, input.state, {
            reason: input.reason,
            ...(input.condition ? { condition: input.condition } : {}),
          });
          // The unmet-demand ledger learns of a failure for want of capacity as it happens.
          if (input.state === 'failed' && isCapacityFailure(input.reason)) {
            await recordCapacityFailure(trx, row, input.condition?.message ?? input.reason);
          }
          log.info({ reservationId: row.id, state: input.state, reason: input.reason }, 'reservation ended');
          return { applied: true, state: input.state };
        },
      );
    },

    /** Sets the reservation's conditions (e.g. `Degraded`/`BindingLost` while a bound node lost devices). */
    async setReservationConditions(input: {
      reservationId: string;
      expectedVersion: number;
      conditions: Condition[];
    }): Promise<StepResult> {
      return guardedStep(
        input,
        () => true,
        async (trx, row) => {
          await updateReservation(trx, row.id, { conditions: input.conditions });
          // The reservation's events say what changed: node health, connectivity, bindings.
          const key = (c: Condition) => `${c.type}/${c.reason}`;
          const before = (row.conditions ?? []) as Condition[];
          const set = input.conditions.filter(
            (c) => !before.some((b) => key(b) === key(c) && b.message === c.message),
          );
          const cleared = before.filter((b) => !input.conditions.some((c) => key(c) === key(b)));
          if (set.length > 0 || cleared.length > 0) {
            await recordReservationEvent(trx, row, 'reservation.conditions-changed', row.state, {
              set: set.map(({ type, reason, message }) => ({ type, reason, message })),
              cleared: cleared.map(({ type, reason, message }) => ({ type, reason, message })),
            });
          }
          return { applied: true, state: row.state };
        },
      );
    },

    /**
     * Moves the lease to compute_now() + leaseSeconds without touching the window. INVALID_STATE in
     * a terminal state, outside placed/binding/active, or for a reservation without a lease.
     */
    async renewLease(input: { reservationId: string }): Promise<{ leaseExpiresAt: number }> {
      return asActivity(() =>
        db.transaction().execute(async (trx) => {
          const row = await lockReservation(trx, input.reservationId);
          if (!row) throw new ComputeError('NOT_FOUND', 'no such reservation');
          if (row.lease_seconds === null) {
            throw new ComputeError('INVALID_STATE', 'the reservation was created without leaseSeconds');
          }
          if (!isRenewable(row.state)) {
            throw new ComputeError(
              'INVALID_STATE',
              `a lease renews in placed, binding or active; it is ${row.state}`,
              {
                state: row.state,
              },
            );
          }
          const renewed = await updateReservation(trx, row.id, { leaseFromNow: true });
          return { leaseExpiresAt: new Date(renewed.leaseExpiresAt!).getTime() };
        }),
      );
    },
  };
}

export type ReservationActivities = ReturnType<typeof createReservationActivities>;

type Trx = Transaction<Database>;
type LockedReservation = NonNullable<Awaited<ReturnType<typeof lockReservationAtVersion>>>;

/** How a reservation's allocations are bound on their nodes: Kubernetes, or a plain hold. */
function bindingOf(row: LockedReservation): 'kubernetes' | 'hold' {
  return row.binding_kind === 'kubernetes' ? 'kubernetes' : 'hold';
}

/** The reservation's stored conditions but those of `type`: what a step keeps before setting its own. */
function conditionsWithout(row: LockedReservation, type: string): Condition[] {
  return ((row.conditions ?? []) as Condition[]).filter((c) => c.type !== type);
}
