import { WorkflowExecutionAlreadyStartedError } from '@temporalio/common';
import { ParentClosePolicy, startChild } from '@temporalio/workflow';
// biome-ignore lint/style/noRestrictedImports: a type-only import, erased before bundling
import type { MachineLeaseActivities } from '../../activities/dedicated-root.ts';
import { metalWorkflowNames } from '../../domain/metal-steps.ts';
import type { ReservationSnapshot } from '../../domain/reservation-lifecycle.ts';
import type { MetalWorkflowInput } from '../metal/messages.ts';
import { searchAttributes } from '../search-attributes.ts';

/**
 * A dedicated-root lease's part of the lifecycle (binding: 'node'), run on every look before
 * `decide`: its deploy and clean workflows (rows the lifecycle's activities wrote) started on
 * Temporal as children that outlive it (ABANDON: a clean runs on after the lease is released), by
 * their own ids; and while binding, the deploys judged (`syncMachineLease`). Answers true when
 * that changed an allocation, so the lifecycle looks again before deciding.
 */
export async function tendMachineLease(
  acts: MachineLeaseActivities,
  s: ReservationSnapshot,
  started: Set<string>,
): Promise<boolean> {
  for (const workflowId of s.machineWorkflowIds ?? []) {
    if (started.has(workflowId)) continue;
    const args: MetalWorkflowInput = { workflowId };
    try {
      await startChild(metalWorkflowNames.type, {
        workflowId,
        args: [args],
        parentClosePolicy: ParentClosePolicy.ABANDON,
        typedSearchAttributes: [{ key: searchAttributes.reservation, value: s.id }],
      });
    } catch (error) {
      if (!(error instanceof WorkflowExecutionAlreadyStartedError)) throw error;
    }
    started.add(workflowId);
  }
  if (s.state !== 'binding') return false;
  const { changed } = await acts.syncMachineLease({ reservationId: s.id });
  return changed > 0;
}
