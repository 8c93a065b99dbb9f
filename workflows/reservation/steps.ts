/**
 * The reservation lifecycle's steps: the activity proxies (regular, or with the short steps local)
 * and the one step each decided action takes. The loop that decides them is workflow.ts.
 */
import { WorkflowExecutionAlreadyStartedError } from '@temporalio/common';
import {
  ChildWorkflowFailure,
  executeChild,
  log,
  proxyActivities,
  proxyLocalActivities,
} from '@temporalio/workflow';
// biome-ignore lint/style/noRestrictedImports: a type-only import, erased before bundling
import type { GangActivities } from '../../activities/gang.ts';
// biome-ignore lint/style/noRestrictedImports: a type-only import, erased before bundling
import type { PlacementActivities } from '../../activities/placement.ts';
// biome-ignore lint/style/noRestrictedImports: a type-only import, erased before bundling
import type { ReportActivities } from '../../activities/reports.ts';
// biome-ignore lint/style/noRestrictedImports: a type-only import, erased before bundling
import type { ReservationActivities } from '../../activities/reservation.ts';
// biome-ignore lint/style/noRestrictedImports: a type-only import, erased before bundling
import type { SweeperActivities } from '../../activities/sweeper.ts';
// biome-ignore lint/style/noRestrictedImports: a type-only import, erased before bundling
import type { UsageActivities } from '../../activities/usage.ts';
import { bookingRepairWorkflowId, type RepairMoment } from '../../domain/booking-repair.ts';
import { assertNever } from '../../domain/errors.ts';
import {
  bindFailure,
  type LifecycleAction,
  type LifecycleTimers,
  type ReservationSnapshot,
} from '../../domain/reservation-lifecycle.ts';
import { type BookingRepairInput, bookingRepairWorkflowType } from '../booking-repair/messages.ts';
import type { bookingRepair } from '../booking-repair/workflow.ts';
import { searchAttributes } from '../search-attributes.ts';
import type { ReservationWorkflowInput } from './messages.ts';
import type { LifecycleHolder } from './state.ts';

export type Activities = ReservationActivities &
  ReportActivities &
  UsageActivities &
  PlacementActivities &
  GangActivities &
  Pick<SweeperActivities, 'wakePoolPending'>;

/** The activity proxies; `startToCloseTimeout` bounds how long a crashed worker holds a step. */
export function activityOptions(input: ReservationWorkflowInput) {
  return {
    startToCloseTimeout: input.activityTimeoutMs ?? 30_000,
    retry: { initialInterval: '1 second', backoffCoefficient: 2, maximumInterval: '30 seconds' },
  };
}

/**
 * The steps that are one short PostgreSQL transaction and follow each other on the way from placed
 * to active and from active to ended. As local activities they run in the worker that holds the
 * workflow task and are recorded in its completion: the recorded full path (placed, binding, active,
 * released, billed) took 13 workflow tasks and 9 activity tasks, and takes 6 and 2 (tests/histories,
 * full-path-observed-locally against full-path-lean). A placement, a gang's replacement, billing and
 * a renewal stay regular activities: they can wait on locks or on IAM.
 */
const localStepNames = new Set<string>([
  'judgeReports',
  'beginBinding',
  'activateReservation',
  'rebindReservation',
  'endReservation',
  'syncAssignments',
  'setReservationConditions',
  'carryRelease',
  'finishRelease',
  'wakePoolPending',
] satisfies (keyof Activities)[]);

/** The activity proxies: every step regular, or (`local`) the steps of `localStepNames` local. */
export function activitiesFor(input: ReservationWorkflowInput, local: boolean): Activities {
  const regular = proxyActivities<Activities>(activityOptions(input));
  if (!local) return regular;
  const near = proxyLocalActivities<Activities>(activityOptions(input));
  return new Proxy(regular, {
    get: (target, name) =>
      (typeof name === 'string' && localStepNames.has(name) ? near : target)[name as keyof Activities],
  });
}

export async function settleUsage(
  acts: Activities,
  reservationId: string,
  snapshot: ReservationSnapshot,
): Promise<void> {
  await acts.meterUsage({ reservationId, windowMs: snapshot.timers.usageWindowMs });
  await acts.sendUsage({ reservationId, windowMs: snapshot.timers.usageWindowMs });
}

/**
 * Takes the step `action` names. With `look`, binding, activating and ending also read the
 * reservation in their own transaction and answer it: the loop's next look.
 */
export async function act(
  acts: Activities,
  reservationId: string,
  s: ReservationSnapshot,
  action: Exclude<LifecycleAction, { kind: 'finish' | 'wait' }>,
  holder: LifecycleHolder,
  look: { timers?: Partial<LifecycleTimers> | undefined } | null = null,
): Promise<ReservationSnapshot | null | undefined> {
  const guard = { reservationId, expectedVersion: s.version };
  switch (action.kind) {
    case 'place':
      holder.memory.lastPlaceAttemptAt = s.now;
      holder.intents.capacityFreed = false;
      await acts.placeReservationAgain(guard);
      return;
    case 'beginBinding':
      return (
        await acts.beginBinding({ ...guard, bindDeadline: action.bindDeadline, ...(look ? { look } : {}) })
      ).snapshot;
    case 'activate':
      holder.memory.meteredThrough = s.now;
      return (await acts.activateReservation({ ...guard, ...(look ? { look } : {}) })).snapshot;
    case 'rebind': {
      holder.memory.lastPlaceAttemptAt = null;
      const result = await acts.rebindReservation({
        ...guard,
        reason: action.reason,
        message: action.message,
      });
      if (result.applied) await acts.wakePoolPending({ poolId: s.poolId });
      return;
    }
    case 'end': {
      const result = await acts.endReservation({
        ...guard,
        state: action.state,
        reason: action.reason,
        ...(action.condition ? { condition: action.condition } : {}),
        ...(look ? { look } : {}),
      });
      // Freed capacity wakes the pool's pending reservations at once, not at their next retry.
      if (result.applied && s.allocations.length > 0) await acts.wakePoolPending({ poolId: s.poolId });
      return result.snapshot;
    }
    case 'syncAssignments':
      await acts.syncAssignments(guard);
      return;
    case 'replaceGangMembers': {
      const result = await acts.replaceGangMembers({
        ...guard,
        allocationIds: action.allocationIds,
        reason: action.reason,
        bindDeadline: action.bindDeadline,
      });
      // No node left for a member: the whole attempt fails, as a single-node binding would.
      if (result.noNodeLeft !== undefined) {
        const failure = bindFailure(s, action.reason, result.noNodeLeft);
        if (failure.kind === 'rebind' || failure.kind === 'end')
          await act(acts, reservationId, s, failure, holder);
      }
      return;
    }
    case 'setConditions':
      await acts.setReservationConditions({ ...guard, conditions: action.conditions });
      return;
    case 'repairBookings':
      await runBookingRepair(s, action.moment, holder);
      return;
    case 'meterUsage':
      holder.memory.meteredThrough = s.now;
      await settleUsage(acts, reservationId, s);
      return;
    case 'carryRelease':
      await acts.carryRelease({ ...guard, until: action.until });
      return;
    case 'finishRelease': {
      const result = await acts.finishRelease({ ...guard, forced: action.forced });
      if (result.applied) await acts.wakePoolPending({ poolId: s.poolId });
      return;
    }
    default:
      return assertNever(action);
  }
}

/**
 * Runs one BookingRepair as a child workflow (its own run in the Temporal UI, filterable by
 * ComputeReservation) and remembers the moment as done, whatever it found: a repair that could not
 * run leaves the bind deadline as the backstop, as before calendar repairs existed.
 */
async function runBookingRepair(
  s: ReservationSnapshot,
  moment: RepairMoment,
  holder: LifecycleHolder,
): Promise<void> {
  const args: BookingRepairInput = { reservationId: s.id, moment };
  try {
    await executeChild<typeof bookingRepair>(bookingRepairWorkflowType, {
      workflowId: bookingRepairWorkflowId(s.id, moment),
      args: [args],
      typedSearchAttributes: [
        { key: searchAttributes.tenant, value: s.tenantId },
        { key: searchAttributes.pool, value: s.poolId },
        { key: searchAttributes.reservation, value: s.id },
        { key: searchAttributes.state, value: 'checking' },
      ],
      memo: { reservation: s.summary, moment },
    });
  } catch (error) {
    if (!(error instanceof ChildWorkflowFailure || error instanceof WorkflowExecutionAlreadyStartedError))
      throw error;
    log.warn('a booking repair did not complete; the bind deadline stays the backstop', {
      reservationId: s.id,
      moment,
      error: error.message,
    });
  }
  holder.memory.repairsDone = [...(holder.memory.repairsDone ?? []), moment];
}
