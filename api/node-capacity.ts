import { z } from 'zod';
import { countCalendarBookings } from '../db/allocations/calendar-bookings.ts';
import { type NodeCapacityRow, readNodeCapacity } from '../db/allocations/node-capacity.ts';
import { schedulingRefusals } from '../domain/holds-publication.ts';
import { tenantIdSchema } from '../domain/reservation-schema.ts';
import {
  heldOf,
  hostPublicationShape,
  publicationFieldsOf,
  readHostPublicationViews,
} from './holds/publication-view.ts';
import { defineMethod } from './method.ts';
import { requireOnTenant } from './reservations/access.ts';

/** Free, total and reserved amounts of one resource; null for what the node never reported. */
const amount = z.object({
  total: z.number().nullable(),
  free: z.number().nullable(),
  reserved: z.number().nullable(),
});

const nodeCapacity = z.object({
  nodeId: z.string(),
  name: z.string(),
  poolId: z.string(),
  ...hostPublicationShape,
  acceptsWork: z.boolean(),
  /** Why it takes no new work (empty when it does): cordoned, draining, unreachable, a condition… */
  refusals: z.array(z.string()),
  gpus: amount,
  vcpu: amount,
  memoryGiB: amount,
  lastHeartbeatAt: z.number().nullable(),
  heartbeatAgeSeconds: z.number().nullable(),
  /**
   * Reservations booked on the node that start later, and the soonest start; `atRisk` when the
   * node takes no new work (BookingRepair will have to move them before they start).
   */
  calendarBookings: z.object({ count: z.number(), nextStart: z.number().nullable(), atRisk: z.boolean() }),
});

const num = (v: string | number | null | undefined) => (v === null || v === undefined ? null : Number(v));

const refusalsOf = (n: NodeCapacityRow, conditions: Array<{ type: string; reason: string }>) =>
  schedulingRefusals(n, conditions);

const nodes = defineMethod({
  summary:
    'One row per node of the pools the tenant can use: whether it accepts work and why not, free, total and reserved GPUs, vCPUs and memory net of every live booking, and the age of its last heartbeat. A figure the node never reported is null, never zero.',
  action: 'compute:capacity:read',
  input: z.strictObject({
    tenantId: tenantIdSchema,
    poolId: z.string().min(1).max(100).optional(),
    limit: z.number().int().min(1).max(2000).default(500),
    /** The last node id of the previous page. */
    cursor: z.string().min(1).max(100).optional(),
  }),
  output: z.object({ nodes: z.array(nodeCapacity), nextCursor: z.string().nullable() }),
  handler: async (ctx, input) => {
    await requireOnTenant(ctx, input.tenantId, 'compute:capacity:read');
    const { page, more, gpus, scalars, conditions } = await readNodeCapacity(ctx.deps.db, input);
    const published = await readHostPublicationViews(
      ctx.deps.db,
      page.map((n) => n.id),
      input.tenantId,
    );
    const calendar = await countCalendarBookings(
      ctx.deps.db,
      page.map((n) => n.id),
    );
    return {
      nodes: page.map((n) => {
        const g = gpus.find((r) => r.node_id === n.id && r.class === n.class);
        const scalar = (resource: string) => {
          const s = scalars.find((r) => r.node_id === n.id && r.resource === resource);
          if (!s) return { total: null, free: null, reserved: null };
          return {
            total: Number(s.allocatable),
            free: Number(s.allocatable) - Number(s.now) - heldOf(published, n.id, resource),
            reserved: Number(s.later),
          };
        };
        const refusals = refusalsOf(
          n,
          conditions.filter((c) => c.node_id === n.id),
        );
        const publication = publicationFieldsOf(published, n.id);
        if (publication.admissionReason === 'reservations_exhausted') refusals.push('reservations_exhausted');
        return {
          nodeId: n.id,
          name: n.name,
          poolId: n.pool_id,
          ...publication,
          acceptsWork: refusals.length === 0,
          refusals,
          gpus: n.devices_reported
            ? { total: num(g?.total) ?? 0, free: num(g?.free) ?? 0, reserved: num(g?.reserved) ?? 0 }
            : { total: null, free: null, reserved: null },
          vcpu: scalar('vcpu'),
          memoryGiB: scalar('memoryGiB'),
          lastHeartbeatAt: n.last_heartbeat_at?.getTime() ?? null,
          heartbeatAgeSeconds: n.last_heartbeat_at
            ? Math.max(0, Math.round((n.now.getTime() - n.last_heartbeat_at.getTime()) / 1000))
            : null,
          calendarBookings: {
            count: calendar.get(n.id)?.count ?? 0,
            nextStart: calendar.get(n.id)?.nextStart ?? null,
            atRisk: (calendar.get(n.id)?.count ?? 0) > 0 && refusals.length > 0,
          },
        };
      }),
      nextCursor: more ? page.at(-1)!.id : null,
    };
  },
});

/** `capacity.nodes`: the per-node view operators rely on (joined to the capacity group in the registry). */
export const nodeCapacityMethods = { nodes };
