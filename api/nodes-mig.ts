import { z } from 'zod';
import { insertAuditEvent } from '../db/events/audit.ts';
import { setNodeMigLayout } from '../db/nodes/mig-layout.ts';
import { migLayoutSettingsSchema } from '../domain/node-spec.ts';
import { defineMethod } from './method.ts';
import { requireNode } from './nodes-access.ts';

const nodeId = z.string().regex(/^node_[0-9a-z]{26}$/, 'a node id (node_…)');

const setMigLayout = defineMethod({
  summary:
    "Set the MIG layout of GPUs of a node in a mig pool (the NodeSpec's `mig-layout` config unit): bcd applies it and the new instances become bookable once the node reports that generation. GPUs not named keep theirs. CONFLICT (details.reservationIds) while live bookings hold a GPU it changes or its instances; INVALID_STATE outside a mig pool.",
  action: 'compute:nodes:configure',
  input: z.strictObject({ nodeId, gpus: migLayoutSettingsSchema.shape.gpus }),
  output: z.object({
    nodeId: z.string(),
    /** The NodeSpec generation that carries the layout; its atoms are bookable once the node observed it. */
    specGeneration: z.number().int(),
    /** False when the layout was already the node's (nothing changes, no new generation). */
    changed: z.boolean(),
  }),
  handler: async (ctx, input) => {
    const scope = await requireNode(ctx, input.nodeId, 'compute:nodes:configure');
    const { generation, changed } = await ctx.deps.db.transaction().execute(async (trx) => {
      const outcome = await setNodeMigLayout(trx, input.nodeId, { gpus: input.gpus });
      if (outcome.changed) {
        await insertAuditEvent(trx, {
          tenantId: scope.tenantId,
          actorIdentityId: ctx.principal.identityId,
          action: 'compute:nodes:configure',
          resourceType: 'compute-node',
          resourceId: input.nodeId,
          requestId: ctx.requestId,
          context: { unit: 'mig-layout', gpus: input.gpus, specGeneration: outcome.generation },
        });
      }
      return outcome;
    });
    return { nodeId: input.nodeId, specGeneration: generation, changed };
  },
});

/** `nodes.setMigLayout`. */
export const nodeMigMethods = { setMigLayout };
