import { z } from 'zod';
import { insertAuditEvent } from '../db/events/audit.ts';
import { clearNodeMaintenance, setNodeMaintenance } from '../db/nodes/provision.ts';
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

/** `nodes.setMaintenance` / `nodes.clearMaintenance`. */
export const nodeMaintenanceMethods = { setMaintenance, clearMaintenance };
