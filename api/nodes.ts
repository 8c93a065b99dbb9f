import { z } from 'zod';
import { countCalendarBookings } from '../db/allocations/calendar-bookings.ts';
import { insertAuditEvent } from '../db/events/audit.ts';
import { insertOutboxEvent } from '../db/events/outbox.ts';
import { finishDrains } from '../db/nodes/drains.ts';
import { listNodeIds, setNodeSchedulingFlags } from '../db/nodes/nodes.ts';
import { countLiveAllocations } from '../db/nodes/workloads.ts';
import { ComputeError } from '../domain/errors.ts';
import { publicationFieldsOf, readHostPublicationViews } from './holds/publication-view.ts';
import { defineMethod, type MethodContext } from './method.ts';
import { operatorReason, requireNode, requirePool, requireTenantRead } from './nodes-access.ts';
import { nodeCommandMethods } from './nodes-commands.ts';
import { nodeMaintenanceMethods } from './nodes-maintenance.ts';
import { nodeMigMethods } from './nodes-mig.ts';
import { nodeTrustMethods } from './nodes-trust.ts';
import { loadNodeViews, nodeView } from './nodes-view.ts';

const nodeId = z.string().regex(/^node_[0-9a-z]{26}$/, 'a node id (node_…)');

const list = defineMethod({
  summary: 'Nodes the caller may see (the root admin: all; a tenant: those of pools it owns), newest first.',
  action: 'compute:nodes:read',
  input: z.strictObject({
    poolId: z.string().min(1).max(100).optional(),
    connectivity: z.enum(['connected', 'unreachable', 'unknown']).optional(),
    limit: z.number().int().min(1).max(500).default(100),
    cursor: nodeId.optional(),
  }),
  output: z.object({ nodes: z.array(nodeView), nextCursor: z.string().nullable() }),
  handler: async (ctx, input) => {
    if (input.poolId) await requirePool(ctx, input.poolId, 'compute:nodes:read');
    else await requireTenantRead(ctx, 'compute:nodes:read');
    const ids = await listNodeIds(ctx.deps.db, {
      ...(ctx.principal.rootAdmin ? {} : { ownerTenantId: ctx.principal.tenantId }),
      ...(input.poolId ? { poolId: input.poolId } : {}),
      ...(input.connectivity ? { connectivity: input.connectivity } : {}),
      ...(input.cursor ? { cursor: input.cursor } : {}),
      limit: input.limit + 1,
    });
    const page = ids.slice(0, input.limit);
    const nodes = await loadNodeViews(ctx.deps.db, page, { devices: false });
    return { nodes, nextCursor: ids.length > input.limit ? page.at(-1)! : null };
  },
});

const get = defineMethod({
  summary: 'One node: its state axes, labels, conditions, devices, session and certificate expiry.',
  action: 'compute:nodes:read',
  input: z.strictObject({ nodeId }),
  output: nodeView,
  handler: async (ctx, input) => {
    await requireNode(ctx, input.nodeId, 'compute:nodes:read');
    const [node] = await loadNodeViews(ctx.deps.db, [input.nodeId], { devices: true });
    if (!node) throw new ComputeError('NOT_FOUND', `node ${input.nodeId} not found`);
    const published = await readHostPublicationViews(ctx.deps.db, [node.id], ctx.principal.tenantId);
    return { ...node, capacity: publicationFieldsOf(published, node.id) };
  },
});

const eventTypes = {
  'compute:nodes:cordon': 'node.cordoned',
  'compute:nodes:uncordon': 'node.uncordoned',
  'compute:nodes:drain': 'node.draining',
} as const;

/** Sets the scheduling flags in one transaction with the event and the audit row; idempotent. */
async function setCordon(
  ctx: MethodContext,
  input: { nodeId: string; reason?: string | undefined },
  action: 'compute:nodes:cordon' | 'compute:nodes:uncordon' | 'compute:nodes:drain',
) {
  const scope = await requireNode(ctx, input.nodeId, action);
  const cordoned = action !== 'compute:nodes:uncordon';
  const draining = action === 'compute:nodes:drain';
  await ctx.deps.db.transaction().execute(async (trx) => {
    const { changed } = await setNodeSchedulingFlags(trx, {
      nodeId: input.nodeId,
      cordoned,
      draining,
      reason: input.reason ?? null,
    });
    if (changed) {
      await insertOutboxEvent(trx, {
        type: eventTypes[action],
        subject: `node/${input.nodeId}`,
        tenantId: scope.tenantId,
        data: { nodeId: input.nodeId, poolId: scope.poolId, reason: input.reason ?? null },
      });
      await insertAuditEvent(trx, {
        tenantId: scope.tenantId,
        actorIdentityId: ctx.principal.identityId,
        action,
        resourceType: 'compute-node',
        resourceId: input.nodeId,
        requestId: ctx.requestId,
        context: { sessionKind: ctx.principal.sessionKind, reason: input.reason ?? null },
      });
    }
    // A node drained while it holds nothing is drained at once (node.drained follows node.draining).
    if (draining) await finishDrains(trx, [input.nodeId]);
  });
  const [node] = await loadNodeViews(ctx.deps.db, [input.nodeId], { devices: false });
  const calendar = (await countCalendarBookings(ctx.deps.db, [input.nodeId])).get(input.nodeId);
  return {
    node: node!,
    liveAllocations: await countLiveAllocations(ctx.deps.db, input.nodeId),
    calendarBookings: calendar?.count ?? 0,
    ...(calendar && cordoned
      ? {
          message: `${calendar.count} calendar booking${calendar.count === 1 ? '' : 's'} on this node start later (the first at ${new Date(calendar.nextStart).toISOString()}); BookingRepair moves them 15 minutes before their start unless the node accepts work again`,
        }
      : {}),
  };
}

const changeOutput = z.object({
  node: nodeView,
  liveAllocations: z.number().int(),
  /** Reservations booked on the node that start later (calendar reservations). */
  calendarBookings: z.number().int(),
  /** When the node holds calendar bookings and takes no new work: what happens to them. */
  message: z.string().optional(),
});

const cordon = defineMethod({
  summary: 'Stop new placements on a node; existing allocations keep running and commands still flow.',
  action: 'compute:nodes:cordon',
  input: z.strictObject({ nodeId, reason: operatorReason.optional() }),
  output: changeOutput,
  handler: (ctx, input) => setCordon(ctx, input, 'compute:nodes:cordon'),
});

const uncordon = defineMethod({
  summary:
    'Let placements reach the node again (clears cordon, drain and a finished drain; taints stay until nodes.untaint).',
  action: 'compute:nodes:uncordon',
  input: z.strictObject({ nodeId }),
  output: changeOutput,
  handler: (ctx, input) => setCordon(ctx, input, 'compute:nodes:uncordon'),
});

const drain = defineMethod({
  summary:
    'Cordon the node and mark it draining (NoSchedule); nothing is released. The drain finishes (drained, event node.drained) when its last allocation ends or is moved off it; nodes.uncordon clears it.',
  action: 'compute:nodes:drain',
  input: z.strictObject({ nodeId, reason: operatorReason.optional() }),
  output: changeOutput,
  handler: (ctx, input) => setCordon(ctx, input, 'compute:nodes:drain'),
});

export const nodeMethods = {
  list,
  get,
  cordon,
  uncordon,
  drain,
  ...nodeCommandMethods,
  ...nodeTrustMethods,
  ...nodeMaintenanceMethods,
  ...nodeMigMethods,
};
