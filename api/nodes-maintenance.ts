import { z } from 'zod';
import { insertAuditEvent } from '../db/events/audit.ts';
import { clearNodeMaintenance, setNodeMaintenance } from '../db/nodes/provision.ts';
import { taintNode, untaintNode } from '../db/nodes/taints.ts';
import { defineMethod, type MethodContext } from './method.ts';
import { operatorReason, requireNode } from './nodes-access.ts';
import { loadNodeViews, nodeView } from './nodes-view.ts';

const nodeId = z.string().regex(/^node_[0-9a-z]{26}$/, 'a node id (node_…)');

const maintenanceOutput = z.object({ node: nodeView, changed: z.boolean() });

/** One transaction: the flag, its event and the audit row; then the node as it stands. */
async function changeMaintenance(
  ctx: MethodContext,
  input: { nodeId: string; reason?: string },
): Promise<z.infer<typeof maintenanceOutput>> {
  const scope = await requireNode(ctx, input.nodeId, 'compute:nodes:maintenance');
  const { changed } = await ctx.deps.db.transaction().execute(async (trx) => {
    const outcome =
      input.reason === undefined
        ? await clearNodeMaintenance(trx, { nodeId: input.nodeId, tenantId: scope.tenantId })
        : await setNodeMaintenance(trx, {
            nodeId: input.nodeId,
            reason: input.reason,
            tenantId: scope.tenantId,
          });
    if (outcome.changed) {
      await insertAuditEvent(trx, {
        tenantId: scope.tenantId,
        actorIdentityId: ctx.principal.identityId,
        action: 'compute:nodes:maintenance',
        resourceType: 'compute-node',
        resourceId: input.nodeId,
        requestId: ctx.requestId,
        context: { maintenance: input.reason !== undefined, reason: input.reason ?? null },
      });
    }
    return outcome;
  });
  const [node] = await loadNodeViews(ctx.deps.db, [input.nodeId], { devices: false });
  return { node: node!, changed };
}

const setMaintenance = defineMethod({
  summary:
    'Put a node in maintenance with a reason: out of placement whatever its provision state (what runs keeps running). Idempotent.',
  action: 'compute:nodes:maintenance',
  input: z.strictObject({ nodeId, reason: operatorReason }),
  output: maintenanceOutput,
  handler: (ctx, input) => changeMaintenance(ctx, input),
});

const clearMaintenance = defineMethod({
  summary:
    'Take a node out of maintenance. Refused (INVALID_STATE) while a failed provisioning workflow of the node waits for metal.retry or metal.abort.',
  action: 'compute:nodes:maintenance',
  input: z.strictObject({ nodeId }),
  output: maintenanceOutput,
  handler: (ctx, input) => changeMaintenance(ctx, { nodeId: input.nodeId }),
});

/** A taint's name: the NoSchedule reason operators read beside the controllers' own conditions. */
const taintReason = z
  .string()
  .trim()
  .regex(
    /^[A-Za-z0-9][A-Za-z0-9 ._:/-]*$/,
    'a taint reason: letters, digits, spaces and . _ : / -, starting with a letter or digit',
  )
  .min(1)
  .max(100);

const taintOutput = z.object({ node: nodeView, changed: z.boolean() });

/** One transaction: the taint condition, its event and the audit row; then the node as it stands. */
async function changeTaint(
  ctx: MethodContext,
  input: { nodeId: string; reason: string },
  tainted: boolean,
): Promise<z.infer<typeof taintOutput>> {
  const scope = await requireNode(ctx, input.nodeId, 'compute:nodes:taint');
  const { changed } = await ctx.deps.db.transaction().execute(async (trx) => {
    const outcome = tainted
      ? await taintNode(trx, {
          nodeId: input.nodeId,
          reason: input.reason,
          tenantId: scope.tenantId,
          by: ctx.principal.identityId,
        })
      : await untaintNode(trx, { nodeId: input.nodeId, reason: input.reason, tenantId: scope.tenantId });
    if (outcome.changed) {
      await insertAuditEvent(trx, {
        tenantId: scope.tenantId,
        actorIdentityId: ctx.principal.identityId,
        action: 'compute:nodes:taint',
        resourceType: 'compute-node',
        resourceId: input.nodeId,
        requestId: ctx.requestId,
        context: { tainted, reason: input.reason },
      });
    }
    return outcome;
  });
  const [node] = await loadNodeViews(ctx.deps.db, [input.nodeId], { devices: false });
  return { node: node!, changed };
}

const taint = defineMethod({
  summary:
    'Taint a node with a named NoSchedule reason (shown among its conditions as Taint:<reason>): it takes no new placements, what runs keeps running. Several taints may stand at once. Idempotent.',
  action: 'compute:nodes:taint',
  input: z.strictObject({ nodeId, reason: taintReason }),
  output: taintOutput,
  handler: (ctx, input) => changeTaint(ctx, input, true),
});

const untaint = defineMethod({
  summary:
    'Remove the taint named reason from a node; it takes placements again once nothing else stops it. Idempotent (an absent taint: changed false).',
  action: 'compute:nodes:taint',
  input: z.strictObject({ nodeId, reason: taintReason }),
  output: taintOutput,
  handler: (ctx, input) => changeTaint(ctx, input, false),
});

/** `nodes.setMaintenance` / `nodes.clearMaintenance`, `nodes.taint` / `nodes.untaint`. */
export const nodeMaintenanceMethods = { setMaintenance, clearMaintenance, taint, untaint };
