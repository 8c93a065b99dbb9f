import { z } from 'zod';
import type { Db } from '../core/database.ts';
import { readCalendarBookings } from '../db/allocations/calendar-bookings.ts';
import { readNodeDetails } from '../db/nodes/view.ts';
import { hostPublicationShape } from './holds/publication-view.ts';

const ms = (d: Date | null | undefined) => (d ? d.getTime() : null);

export const nodeView = z.object({
  id: z.string(),
  name: z.string(),
  siteId: z.string(),
  poolId: z.string().nullable(),
  role: z.string(),
  provisionState: z.string(),
  cordoned: z.boolean(),
  cordonReason: z.string().nullable(),
  draining: z.boolean(),
  /** The drain finished: the node's last allocation ended (nodes.uncordon clears it). */
  drained: z.boolean(),
  drainedAt: z.number().nullable(),
  /** The operator's taints (nodes.taint): named NoSchedule reasons, also among the conditions. */
  taints: z.array(z.string()),
  maintenance: z.boolean(),
  /** Why the node is in maintenance (an operator's reason, or the workflow step that failed). */
  maintenanceReason: z.string().nullable(),
  connectivity: z.enum(['connected', 'unreachable', 'unknown']),
  epoch: z.number(),
  lastHeartbeatAt: z.number().nullable(),
  agentVersion: z.string().nullable(),
  capabilities: z.array(z.string()),
  specGeneration: z.number(),
  observedGeneration: z.number().nullable(),
  certificateNotAfter: z.number().nullable(),
  labels: z.array(z.object({ key: z.string(), value: z.string(), source: z.string() })),
  conditions: z.array(
    z.object({
      type: z.string(),
      reason: z.string(),
      message: z.string(),
      effect: z.string().nullable(),
      since: z.number(),
    }),
  ),
  gpuCount: z.number(),
  /** nodes.get: what the node publishes net of every live hold and reservation, and its holds. */
  capacity: z.object(hostPublicationShape).optional(),
  devices: z
    .array(
      z.object({
        id: z.string(),
        class: z.string(),
        stableId: z.string(),
        health: z.string(),
        attributes: z.record(z.string(), z.unknown()),
      }),
    )
    .optional(),
  /**
   * With the devices (nodes.get): the calendar bookings on the node, soonest first (at most 50):
   * reservations booked ahead whose start BookingRepair will move if the node stays unschedulable.
   */
  calendarBookings: z
    .array(
      z.object({
        reservationId: z.string(),
        tenantId: z.string(),
        allocationId: z.string(),
        start: z.number(),
        end: z.number(),
        atoms: z.number(),
      }),
    )
    .optional(),
});
export type NodeView = z.infer<typeof nodeView>;

/** Reads nodes with their labels, conditions, GPU count (and devices), in the order of `ids`. */
export async function loadNodeViews(
  db: Db,
  ids: readonly string[],
  options: { devices: boolean },
): Promise<NodeView[]> {
  const nodes = await readNodeDetails(db, ids, options);
  const calendar = options.devices ? await readCalendarBookings(db, ids) : null;
  return nodes.map((n) => ({
    ...n,
    ...(calendar ? { calendarBookings: calendar.get(n.id) ?? [] } : {}),
    drained: n.drainedAt !== null,
    drainedAt: ms(n.drainedAt),
    lastHeartbeatAt: ms(n.lastHeartbeatAt),
    certificateNotAfter: ms(n.certificateNotAfter),
    conditions: n.conditions.map((c) => ({ ...c, since: c.since.getTime() })),
  }));
}
