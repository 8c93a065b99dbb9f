import type { GangPreview } from '../db/allocations/gang-placement.ts';
import type { PlanOutcome } from '../db/allocations/placement.ts';
import type { Interval } from '../domain/placer.ts';

/** A gang preview as the single-node outcome capacity.preview answers (its first member as the node). */
export function gangPlanOutcome(gang: GangPreview, window: Interval): PlanOutcome {
  return gang.fits
    ? { fits: true, fit: gang.members[0]!, window }
    : { fits: false, message: gang.message, earliestStart: gang.earliestStart, window };
}

/** capacity.preview's `gang`: the members it would take, the topology value, and every value's fate. */
export function gangPreviewFields(gang: GangPreview) {
  return {
    topologyValue: gang.fits ? gang.topologyValue : null,
    members: gang.fits
      ? gang.members.map((m) => ({ nodeId: m.nodeId, nodeName: m.nodeName, deviceIds: m.deviceIds }))
      : [],
    values: gang.groups,
  };
}
