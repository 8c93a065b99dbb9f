import {
  ActivityFailure,
  ApplicationFailure,
  allHandlersFinished,
  condition,
  continueAsNew,
  log,
  patched,
  proxyLocalActivities,
  setHandler,
  sleep,
  upsertMemo,
  upsertSearchAttributes,
  workflowInfo,
} from '@temporalio/workflow';
import { decide, type ReservationSnapshot } from '../../domain/reservation-lifecycle.ts';
import { isUnstarted } from '../../domain/reservation-states.ts';
import { searchAttributes } from '../search-attributes.ts';
import { tendMachineLease } from './dedicated-root.ts';
import {
  allocationReportSignal,
  cancelUpdate,
  capacityFreedSignal,
  confirmationUpdate,
  extendedUpdate,
  type ReservationWorkflowInput,
  releaseUpdate,
  renewUpdate,
  snapshotQuery,
  wakeSignal,
} from './messages.ts';
import { handleOperatorSignals } from './operator-signals.ts';
import { LifecycleHolder } from './state.ts';
import { type Activities, act, activitiesFor, activityOptions, settleUsage } from './steps.ts';

/**
 * The look at the reservation (a read, the loop's most frequent step) as a local activity: it runs
 * in the worker that holds the workflow task and is recorded in that task's completion, so Temporal
 * dispatches no activity task and no second workflow task for it (the server's CPU from a
 * lifecycle's start to its first look fell by about a tenth: bench/README.md). Histories recorded
 * before it replay with the regular activity.
 */
const observeLocally = 'observe-as-local-activity';

/**
 * A lifecycle that costs Temporal less: the steps of `localStepNames` are local activities (the
 * look too, without asking `observeLocally`: every patch is a marker plus a search-attribute upsert
 * of its own); the first look upserts only the search attributes its start did not already set;
 * reports are not judged where none can be new (before the first look at a reservation that has
 * not started, and right after activating it); and binding and activating read the reservation in
 * their own transaction (ending too), which is the next look unless a signal came meanwhile. Histories recorded
 * before it replay as they were.
 */
const leanLifecycle = 'lean-lifecycle';

const defaultHistoryLimit = 2_000;

/**
 * One reservation's lifecycle, its workflow id the reservation id. Level-triggered: every wake-up
 * (a timer, a signal, an update) re-reads the reservation from PostgreSQL and takes the one action
 * `decide` answers, each an activity that is one transaction. It owns every moment of the
 * reservation (start, 15 minutes before it, bind deadline, end, lease deadline, pending retry,
 * maxPending, billing windows) and ends when the reservation is terminal and billed.
 */
export async function reservationLifecycle(input: ReservationWorkflowInput): Promise<{ state: string }> {
  const reservationId = input.reservationId;
  const regularActs = activitiesFor(input, false);
  const localStepActs = activitiesFor(input, true);
  const localActs = proxyLocalActivities<Pick<Activities, 'observeReservation'>>(activityOptions(input));
  const holder = new LifecycleHolder(input.carried);
  const untilTerminal = async () => {
    await condition(() => holder.terminal());
    return { state: holder.state! };
  };

  setHandler(wakeSignal, () => holder.wake());
  setHandler(allocationReportSignal, (report) => {
    if (holder.snapshot && !holder.owns(report.allocationId)) {
      log.warn('ignored a report about an allocation this reservation does not own', {
        reservationId,
        allocationId: report.allocationId,
        kind: report.kind,
      });
      return;
    }
    holder.reportsPending = true;
    holder.wake();
  });
  setHandler(capacityFreedSignal, () => {
    holder.intents.capacityFreed = true;
    holder.wake();
  });
  setHandler(
    releaseUpdate,
    async () => {
      await condition(() => holder.snapshot !== null);
      holder.validateRelease();
      holder.intents.release = true;
      holder.wake();
      // A kubernetes binding whose pods hold its GPUs answers `releasing`: it ends when they go.
      await condition(() => holder.terminal() || holder.state === 'releasing');
      return { state: holder.state! };
    },
    { validator: () => holder.validateRelease() },
  );
  setHandler(
    cancelUpdate,
    async () => {
      await condition(() => holder.snapshot !== null);
      holder.validateCancel();
      holder.intents.cancel = true;
      holder.wake();
      // The truth may have moved on (the start passed) before the workflow acted on the cancel.
      await condition(() => holder.terminal() || !holder.cancellable());
      if (!holder.terminal()) {
        holder.intents.cancel = false;
        holder.validateCancel();
      }
      return { state: holder.state! };
    },
    { validator: () => holder.validateCancel() },
  );
  setHandler(
    renewUpdate,
    async () => {
      await condition(() => holder.snapshot !== null);
      holder.validateRenew();
      try {
        const renewed = await regularActs.renewLease({ reservationId });
        holder.wake();
        return renewed;
      } catch (error) {
        // The activity's typed failure (INVALID_STATE when the truth moved on) is the update's answer.
        if (error instanceof ActivityFailure && error.cause instanceof ApplicationFailure) throw error.cause;
        throw error;
      }
    },
    { validator: () => holder.validateRenew() },
  );
  setHandler(
    extendedUpdate,
    async ({ end }) => {
      const looked = holder.looks;
      holder.wake();
      await condition(() => holder.looks > looked);
      return { end: holder.snapshot?.end ?? end };
    },
    { validator: (update) => holder.validateExtended(update) },
  );
  setHandler(
    confirmationUpdate,
    async ({ decision }) => {
      await condition(() => holder.snapshot !== null);
      holder.validateConfirmation({ decision });
      holder.intents.confirmation = decision;
      holder.wake();
      if (decision === 'denied') return untilTerminal();
      return { state: holder.state! };
    },
    { validator: (update) => holder.validateConfirmation(update) },
  );
  setHandler(snapshotQuery, () => holder.snapshot);
  handleOperatorSignals(reservationId, holder, { activityTimeoutMs: input.activityTimeoutMs });

  const historyFull = () => {
    const info = workflowInfo();
    return info.continueAsNewSuggested || info.historyLength > (input.historyLimit ?? defaultHistoryLimit);
  };
  const machineWorkflowsStarted = new Set<string>();
  const continueWithCarried = () =>
    continueAsNew<typeof reservationLifecycle>({ ...input, carried: holder.carried() });

  // The last step activated the reservation: the state last seen, `binding`, is already past.
  let activated = false;
  // The look the last step took in its own transaction (lean): the next look, unless woken since.
  let stepLook: ReservationSnapshot | null = null;
  for (;;) {
    const tookLook = stepLook;
    stepLook = null;
    holder.dirty = false;
    const lean = patched(leanLifecycle);
    const acts = lean ? localStepActs : regularActs;
    // A stored report counts only once the worker has verified it: judge before looking. A lean
    // run looks first, and judges before a second look only if nodes may have reported.
    const firstLeanLook = lean && holder.snapshot === null;
    const binding = holder.state === 'binding' && !(lean && activated);
    activated = false;
    if (!tookLook && !firstLeanLook && (holder.reportsPending || binding)) {
      holder.reportsPending = false;
      await acts.judgeReports({ reservationId });
    }
    const observe = lean || patched(observeLocally) ? localActs.observeReservation : acts.observeReservation;
    const snapshot = tookLook ?? (await observe({ reservationId, timers: input.timers }));
    if (!snapshot) {
      log.warn('no such reservation; the lifecycle ends', { reservationId });
      return { state: 'missing' };
    }
    publish(holder, snapshot, lean);
    if (firstLeanLook && holder.reportsPending) {
      if (isUnstarted(snapshot.state)) holder.reportsPending = false;
      else continue;
    }
    // A dedicated-root lease: its deploys and wipes started, its deploys judged (binding: 'node').
    if (snapshot.machineWorkflowIds && (await tendMachineLease(acts, snapshot, machineWorkflowsStarted)))
      continue;
    const action = decide(snapshot, holder.intents, holder.memory);
    if (action.kind === 'finish') {
      await settleUsage(acts, reservationId, snapshot);
      await condition(allHandlersFinished);
      return { state: snapshot.state };
    }
    if (action.kind === 'wait') {
      // Bounded history. Only here: a handler waiting for the loop to act (release, cancel) has
      // already been served once the loop has nothing to do but wait.
      if (historyFull()) {
        await condition(allHandlersFinished);
        return continueWithCarried();
      }
      if (!holder.dirty) await condition(() => holder.dirty, Math.max(action.until - snapshot.now, 10));
      continue;
    }
    try {
      const look = lean ? { timers: input.timers } : null;
      const after = await act(acts, reservationId, snapshot, action, holder, look);
      activated = action.kind === 'activate';
      // A signal during the step may tell of a change after its transaction: then look afresh.
      if (after && !holder.dirty && !holder.reportsPending) stepLook = after;
    } catch (error) {
      if (!(error instanceof ActivityFailure)) throw error;
      // A step refused (a race, or a code the table says not to retry): look again after a pause.
      log.warn('a lifecycle step failed; looking again', {
        reservationId,
        action: action.kind,
        error: error.message,
      });
      await sleep(1_000);
      if (historyFull() && allHandlersFinished()) return continueWithCarried();
    }
  }
}

function publish(holder: LifecycleHolder, snapshot: ReservationSnapshot, lean: boolean): void {
  const first = holder.snapshot === null;
  const changed = holder.observe(snapshot);
  if (first) {
    // The lifecycle fills in its own search attributes, whoever started it and with what.
    const wanted = [
      { key: searchAttributes.tenant, value: snapshot.tenantId },
      { key: searchAttributes.pool, value: snapshot.poolId },
      { key: searchAttributes.state, value: snapshot.state },
    ];
    const started = workflowInfo().typedSearchAttributes;
    const missing = lean ? wanted.filter(({ key, value }) => started.get(key) !== value) : wanted;
    if (missing.length > 0) upsertSearchAttributes(missing);
    upsertMemo({ reservation: snapshot.summary, tenantId: snapshot.tenantId, poolId: snapshot.poolId });
  } else if (changed) {
    upsertSearchAttributes([{ key: searchAttributes.state, value: snapshot.state }]);
  }
}
