import { sql } from 'kysely';
import { z } from 'zod';
import { insertOutboxEvent } from '../db/events/outbox.ts';
import { setNodeCondition } from '../db/nodes/nodes.ts';
import { ComputeError } from '../domain/errors.ts';
import { defineMethod, type MethodContext } from './method.ts';
import { requireNode, requirePool, requireTenantRead } from './nodes-access.ts';
import { nodeCommandMethods } from './nodes-commands.ts';
import { loadNodeViews, nodeView } from './nodes-view.ts';

const nodeId = z.string().regex(/^node_[0-9a-z]{26}$/, 'a node id (node_…)');
const reason = z.string().trim().min(1).max(500);

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
    let query = ctx.deps.db
      .selectFrom('nodes as n')
      .leftJoin('pools as p', 'p.id', 'n.pool_id')
      .select('n.id')
      .orderBy('n.id', 'desc')
      .limit(input.limit + 1);
    if (!ctx.principal.rootAdmin) query = query.where('p.owner_tenant_id', '=', ctx.principal.tenantId);
    if (input.poolId) query = query.where('n.pool_id', '=', input.poolId);
    if (input.connectivity) query = query.where('n.connectivity', '=', input.connectivity);
    if (input.cursor) query = query.where('n.id', '<', input.cursor);
    const ids = (await query.execute()).map((r) => r.id);
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
    return node;
  },
});

const eventTypes = {
  'compute:nodes:cordon': 'node.cordoned',
  'compute:nodes:uncordon': 'node.uncordoned',
  'compute:nodes:drain': 'node.draining',
} as const;

/** Sets the cordon flags in one transaction with the event and the audit row; idempotent. */
async function setCordon(
  ctx: MethodContext,
  input: { nodeId: string; reason?: string | undefined },
  action: 'compute:nodes:cordon' | 'compute:nodes:uncordon' | 'compute:nodes:drain',
) {
  const scope = await requireNode(ctx, input.nodeId, action);
  const cordoned = action !== 'compute:nodes:uncordon';
  const draining = action === 'compute:nodes:drain';
  await ctx.deps.db.transaction().execute(async (trx) => {
    const before = await trx
      .selectFrom('nodes')
      .select(['cordoned', 'draining'])
      .where('id', '=', input.nodeId)
      .forUpdate()
      .executeTakeFirstOrThrow();
    await trx
      .updateTable('nodes')
      .set({
        cordoned,
        draining: draining || (cordoned && before.draining && action !== 'compute:nodes:cordon'),
        cordon_reason: cordoned ? (input.reason ?? null) : null,
        updated_at: sql<Date>`compute_now()`,
      })
      .where('id', '=', input.nodeId)
      .execute();
    if (draining) {
      await setNodeCondition(trx, input.nodeId, {
        type: 'Draining',
        reason: 'DrainRequested',
        message: input.reason ?? 'nodes.drain',
        effect: 'NoSchedule',
      });
    } else if (!cordoned) {
      await setNodeCondition(trx, input.nodeId, null, 'Draining');
    }
    const changed =
      before.cordoned !== cordoned || (draining && !before.draining) || (!cordoned && before.draining);
    if (changed) {
      await insertOutboxEvent(trx, {
        type: eventTypes[action],
        subject: `node/${input.nodeId}`,
        tenantId: scope.tenantId,
        data: { nodeId: input.nodeId, poolId: scope.poolId, reason: input.reason ?? null },
      });
      await trx
        .insertInto('audit_events')
        .values({
          tenant_id: scope.tenantId,
          actor_identity_id: ctx.principal.identityId,
          action,
          resource_type: 'compute-node',
          resource_id: input.nodeId,
          request_id: ctx.requestId,
          context: JSON.stringify({ sessionKind: ctx.principal.sessionKind, reason: input.reason ?? null }),
        })
        .execute();
    }
  });
  const [node] = await loadNodeViews(ctx.deps.db, [input.nodeId], { devices: false });
  const live = await ctx.deps.db
    .selectFrom('allocations')
    .select((eb) => eb.fn.countAll<string>().as('n'))
    .where('node_id', '=', input.nodeId)
    .where('state', 'not in', ['released', 'failed'])
    .executeTakeFirstOrThrow();
  return { node: node!, liveAllocations: Number(live.n) };
}

const changeOutput = z.object({ node: nodeView, liveAllocations: z.number().int() });

const cordon = defineMethod({
  summary: 'Stop new placements on a node; existing allocations keep running and commands still flow.',
  action: 'compute:nodes:cordon',
  input: z.strictObject({ nodeId, reason: reason.optional() }),
  output: changeOutput,
  handler: (ctx, input) => setCordon(ctx, input, 'compute:nodes:cordon'),
});

const uncordon = defineMethod({
  summary: 'Let placements reach the node again (clears cordon and drain).',
  action: 'compute:nodes:uncordon',
  input: z.strictObject({ nodeId }),
  output: changeOutput,
  handler: (ctx, input) => setCordon(ctx, input, 'compute:nodes:uncordon'),
});

const drain = defineMethod({
  summary: 'Cordon the node and mark it draining (NoSchedule) until it is empty; nothing is released.',
  action: 'compute:nodes:drain',
  input: z.strictObject({ nodeId, reason: reason.optional() }),
  output: changeOutput,
  handler: (ctx, input) => setCordon(ctx, input, 'compute:nodes:drain'),
});

export const nodeMethods = { list, get, cordon, uncordon, drain, ...nodeCommandMethods };
