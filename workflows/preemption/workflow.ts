import {
  condition,
  getExternalWorkflowHandle,
  log,
  proxyActivities,
  setHandler,
  upsertSearchAttributes,
} from '@temporalio/workflow';
// biome-ignore lint/style/noRestrictedImports: a type-only import, erased before bundling
import type { PreemptionActivities } from '../../activities/preemption.ts';
import { wakeSignal } from '../reservation/messages.ts';
import { searchAttributes } from '../search-attributes.ts';
import { type PreemptionWorkflowInput, preemptionStatusQuery, preemptionWakeSignal } from './messages.ts';

/**
 * One spot preemption: it owns the notice. It wakes the lifecycles involved (the noticed spot
 * reservations see their new end, the re-queued ones place again), waits until the deadline on a
 * Temporal timer (it survives worker restarts) or a wake-up, releases the noticed spot reservations
 * with reason `preempted`, and wakes the lifecycles again (the spot ones settle their billing, the
 * regular one binds at its start). Level-triggered: every look reads compute_now() and what is
 * still under notice from PostgreSQL. Searchable: `WorkflowType = 'spotPreemption'` with
 * ComputeTenant, ComputePool, ComputeReservation (the preempting reservation) and ComputeState
 * (`notice`, then `completed`).
 */
export async function spotPreemption(input: PreemptionWorkflowInput): Promise<{ released: string[] }> {
  const acts = proxyActivities<PreemptionActivities>({
    startToCloseTimeout: input.activityTimeoutMs ?? 30_000,
    retry: { initialInterval: '1 second', backoffCoefficient: 2, maximumInterval: '30 seconds' },
  });
  let dirty = false;
  let open: string[] = [...input.noticed];
  const released: string[] = [];
  setHandler(preemptionWakeSignal, () => {
    dirty = true;
  });
  setHandler(preemptionStatusQuery, () => ({ deadline: input.deadline, open, released }));
  upsertSearchAttributes([
    { key: searchAttributes.tenant, value: input.tenantId },
    { key: searchAttributes.pool, value: input.poolId },
    { key: searchAttributes.reservation, value: input.reservationId },
    { key: searchAttributes.state, value: 'notice' },
  ]);
  await wake([...input.noticed, ...input.requeued, input.reservationId], 'preemption-notice');

  for (;;) {
    dirty = false;
    const look = await acts.observePreemption({
      spotReservationIds: input.noticed,
      deadline: input.deadline,
    });
    open = look.open;
    if (open.length === 0) break;
    if (look.now >= input.deadline) {
      const done = await acts.releasePreemptedReservations({
        spotReservationIds: open,
        deadline: input.deadline,
        preemptedBy: input.reservationId,
      });
      released.push(...done.released);
      continue;
    }
    await condition(() => dirty, Math.max(input.deadline - look.now, 10));
  }
  upsertSearchAttributes([{ key: searchAttributes.state, value: 'completed' }]);
  await wake([...input.noticed, input.reservationId], 'preempted');
  return { released };
}

/** Wakes reservation lifecycles; one that has ended (or never ran) is no reason to fail. */
async function wake(reservationIds: readonly string[], reason: string): Promise<void> {
  await Promise.all(
    reservationIds.map((id) =>
      getExternalWorkflowHandle(id)
        .signal(wakeSignal, { reason })
        .catch((error: unknown) =>
          log.info('a lifecycle could not be woken', { reservationId: id, error: String(error) }),
        ),
    ),
  );
}
