import { type Client, WorkflowUpdateFailedError } from '@temporalio/client';
import {
  ActivityFailure,
  ApplicationFailure,
  WorkflowExecutionAlreadyStartedError,
  WorkflowNotFoundError,
} from '@temporalio/common';
import type { LifecycleSignal, ReservationLifecycle } from '../core/deps.ts';
import { assertNever, ComputeError, isErrorCode } from '../domain/errors.ts';
import { metalWorkflowNames } from '../domain/metal-steps.ts';
import type { LifecycleTimers } from '../domain/reservation-lifecycle.ts';
import { preemptionWakeSignal, preemptionWorkflowType } from '../workflows/preemption/messages.ts';
import {
  allocationReportSignal,
  cancelUpdate,
  capacityFreedSignal,
  confirmationUpdate,
  extendedUpdate,
  releaseUpdate,
  renewUpdate,
  reservationWorkflowType,
  wakeSignal,
} from '../workflows/reservation/messages.ts';
import { searchAttributes } from '../workflows/search-attributes.ts';

export interface LifecycleOptions {
  taskQueue: string;
  /** Timer overrides every started workflow carries (tests use seconds). */
  timers?: Partial<LifecycleTimers>;
  historyLimit?: number;
  /** How long one activity attempt may run before it is retried elsewhere (tests: seconds). */
  activityTimeoutMs?: number;
}

export interface LifecycleStartInput {
  id: string;
  /** The search attributes to start with; the workflow sets them itself on its first look. */
  tenantId?: string;
  poolId?: string;
  state?: string;
}

/**
 * Starts a reservation's lifecycle, or wakes it when it is already running (signal-with-start on
 * the reservation id): calling it twice, or for a reservation whose workflow the sweeper already
 * started, is harmless. A run for a terminal reservation looks once, settles billing and ends.
 */
export async function startReservationLifecycle(
  client: Client,
  options: LifecycleOptions,
  reservation: LifecycleStartInput,
  reason = 'start',
): Promise<void> {
  await client.workflow.signalWithStart(reservationWorkflowType, {
    workflowId: reservation.id,
    taskQueue: options.taskQueue,
    args: [
      {
        reservationId: reservation.id,
        ...(options.timers ? { timers: options.timers } : {}),
        ...(options.historyLimit ? { historyLimit: options.historyLimit } : {}),
        ...(options.activityTimeoutMs ? { activityTimeoutMs: options.activityTimeoutMs } : {}),
      },
    ],
    signal: wakeSignal,
    signalArgs: [{ reason }],
    typedSearchAttributes: [
      ...(reservation.tenantId ? [{ key: searchAttributes.tenant, value: reservation.tenantId }] : []),
      ...(reservation.poolId ? [{ key: searchAttributes.pool, value: reservation.poolId }] : []),
      ...(reservation.state ? [{ key: searchAttributes.state, value: reservation.state }] : []),
    ],
    memo: { reservationId: reservation.id },
  });
}

/** Turns a failed update into the ComputeError its ApplicationFailure names. */
function translate(error: unknown): unknown {
  const cause =
    error instanceof WorkflowUpdateFailedError && error.cause instanceof ActivityFailure
      ? error.cause.cause
      : error instanceof WorkflowUpdateFailedError
        ? error.cause
        : undefined;
  if (cause instanceof ApplicationFailure) {
    const failure = cause;
    const code = isErrorCode(failure.type) ? failure.type : 'INTERNAL';
    const details = failure.details?.[0];
    return new ComputeError(
      code,
      failure.message,
      details && typeof details === 'object' ? (details as Record<string, unknown>) : undefined,
    );
  }
  return error;
}

/**
 * The ReservationLifecycle admission and the gateway call, backed by Temporal: `start` (tolerant of
 * a workflow that already runs), `signal` (updates where the caller waits on the outcome, with the
 * workflow's validators answering INVALID_STATE or INVALID_INPUT; signals for wake-ups), `renew`
 * (answers the new lease deadline) and `wakePool`.
 */
export function createTemporalLifecycle(
  client: Client,
  options: LifecycleOptions,
): ReservationLifecycle & { renew(reservationId: string): Promise<{ leaseExpiresAt: Date }> } {
  const handle = (id: string) => client.workflow.getHandle(id);

  /** Runs an update; when no workflow runs for the reservation, starts one first and tries again. */
  async function update<R>(reservationId: string, run: () => Promise<R>): Promise<R> {
    try {
      return await run();
    } catch (error) {
      if (!(error instanceof WorkflowNotFoundError)) throw translate(error);
    }
    // A lifecycle completes only once its reservation is terminal; one that never started (or was
    // terminated) is started now, and fills in its own search attributes on its first look.
    let status: string | null = null;
    try {
      status = (await handle(reservationId).describe()).status.name;
    } catch (error) {
      if (!(error instanceof WorkflowNotFoundError)) throw error;
    }
    if (status === 'COMPLETED') {
      throw new ComputeError('INVALID_STATE', 'the reservation has ended', { reservationId });
    }
    await startReservationLifecycle(client, options, { id: reservationId }, 'update');
    try {
      return await run();
    } catch (error) {
      throw translate(error);
    }
  }

  return {
    async start(reservation, reason) {
      await startReservationLifecycle(client, options, reservation, reason);
    },

    async running(reservationIds) {
      const running = new Set<string>();
      for (let i = 0; i < reservationIds.length; i += 100) {
        const ids = reservationIds.slice(i, i + 100).map((id) => `'${id.replace(/'/g, '')}'`);
        for await (const execution of client.workflow.list({
          query: `WorkflowType = '${reservationWorkflowType}' AND ExecutionStatus = 'Running' AND WorkflowId IN (${ids.join(', ')})`,
        })) {
          running.add(execution.workflowId);
        }
      }
      return running;
    },

    async signal(reservationId: string, signal: LifecycleSignal) {
      switch (signal.type) {
        case 'release':
          await update(reservationId, () => handle(reservationId).executeUpdate(releaseUpdate));
          return;
        case 'cancel':
          await update(reservationId, () => handle(reservationId).executeUpdate(cancelUpdate));
          return;
        case 'confirmation':
          await update(reservationId, () =>
            handle(reservationId).executeUpdate(confirmationUpdate, {
              args: [{ decision: signal.decision }],
            }),
          );
          return;
        case 'extended':
          if (typeof signal.end === 'number') {
            const end = signal.end;
            await update(reservationId, () =>
              handle(reservationId).executeUpdate(extendedUpdate, { args: [{ end }] }),
            );
          } else {
            await handle(reservationId).signal(wakeSignal, { reason: 'extended' });
          }
          return;
        case 'wake':
          try {
            await handle(reservationId).signal(wakeSignal, { reason: signal.reason });
          } catch (error) {
            if (!(signal.ifRunning && error instanceof WorkflowNotFoundError)) throw error;
          }
          return;
        case 'capacityFreed':
          await handle(reservationId).signal(capacityFreedSignal, { poolId: signal.poolId });
          return;
        case 'allocationReport':
          await handle(reservationId).signal(allocationReportSignal, {
            allocationId: signal.allocationId,
            kind: signal.kind,
          });
          return;
        default:
          return assertNever(signal);
      }
    },

    async renew(reservationId: string) {
      const result = await update(reservationId, () => handle(reservationId).executeUpdate(renewUpdate));
      return { leaseExpiresAt: new Date(result.leaseExpiresAt) };
    },

    async preempt(preemption) {
      try {
        await client.workflow.start(preemptionWorkflowType, {
          workflowId: preemption.id,
          taskQueue: options.taskQueue,
          args: [
            {
              ...preemption,
              ...(options.activityTimeoutMs ? { activityTimeoutMs: options.activityTimeoutMs } : {}),
            },
          ],
          typedSearchAttributes: [
            { key: searchAttributes.tenant, value: preemption.tenantId },
            { key: searchAttributes.pool, value: preemption.poolId },
            { key: searchAttributes.reservation, value: preemption.reservationId },
            { key: searchAttributes.state, value: 'notice' },
          ],
          memo: { preemption },
        });
        return true;
      } catch (error) {
        if (!(error instanceof WorkflowExecutionAlreadyStartedError)) throw error;
        return false;
      }
    },

    async wakePreemption(preemptionId: string) {
      try {
        await client.workflow.getHandle(preemptionId).signal(preemptionWakeSignal, { reason: 'called-off' });
      } catch (error) {
        // A preemption whose workflow already finished (or never started) has nothing to wake.
        if (!(error instanceof WorkflowNotFoundError)) throw error;
      }
    },

    async wakeMetalWorkflow(workflowId: string) {
      try {
        await client.workflow.getHandle(workflowId).signal(metalWorkflowNames.wakeSignal);
      } catch (error) {
        if (!(error instanceof WorkflowNotFoundError)) throw error;
      }
    },

    async wakePool(poolId: string) {
      const query = `WorkflowType = '${reservationWorkflowType}' AND ExecutionStatus = 'Running' AND ${searchAttributes.pool.name} = '${poolId.replace(/'/g, '')}' AND ${searchAttributes.state.name} = 'pending'`;
      const signals: Array<Promise<void>> = [];
      for await (const execution of client.workflow.list({ query })) {
        signals.push(
          handle(execution.workflowId)
            .signal(capacityFreedSignal, { poolId })
            .catch(() => {}),
        );
      }
      await Promise.all(signals);
    },
  };
}
