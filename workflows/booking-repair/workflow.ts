import { proxyActivities, upsertMemo, upsertSearchAttributes, workflowInfo } from '@temporalio/workflow';
// biome-ignore lint/style/noRestrictedImports: a type-only import, erased before bundling
import type { BookingRepairActivities } from '../../activities/booking-repair.ts';
import type { RepairOutcome } from '../../domain/booking-repair.ts';
import { searchAttributes } from '../search-attributes.ts';
import type { BookingRepairInput } from './messages.ts';

/**
 * One BookingRepair of a calendar reservation, started by its lifecycle 15 minutes before the
 * start and again at the start: one activity (one transaction) checks every booked node and atom
 * and re-places the bad members all or nothing. Its outcome (`healthy`, `repaired`, `failed`,
 * `skipped`) is the workflow's result, its memo and its ComputeState search attribute, so the
 * Temporal UI filters repairs: `WorkflowType = "bookingRepair" AND ComputeState = "failed"`.
 */
export async function bookingRepair(input: BookingRepairInput): Promise<RepairOutcome> {
  const acts = proxyActivities<BookingRepairActivities>({
    startToCloseTimeout: input.activityTimeoutMs ?? 60_000,
    retry: { initialInterval: '1 second', backoffCoefficient: 2, maximumInterval: '30 seconds' },
  });
  const outcome = await acts.repairBookings({
    reservationId: input.reservationId,
    moment: input.moment,
    workflowId: workflowInfo().workflowId,
  });
  upsertSearchAttributes([{ key: searchAttributes.state, value: outcome.outcome }]);
  upsertMemo({ outcome: outcome.outcome, moment: input.moment });
  return outcome;
}
