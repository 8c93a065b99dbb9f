import { z } from 'zod';
import type { Db } from '../core/database.ts';
import { readNodeDetails } from '../db/nodes/view.ts';

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
  maintenance: z.boolean(),
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
});
export type NodeView = z.infer<typeof nodeView>;

/** Reads nodes with their labels, conditions, GPU count (and devices), in the order of `ids`. */
export async function loadNodeViews(
  db: Db,
  ids: readonly string[],
  options: { devices: boolean },
): Promise<NodeView[]> {
  const nodes = await readNodeDetails(db, ids, options);
  return nodes.map((n) => ({
    ...n,
    lastHeartbeatAt: ms(n.lastHeartbeatAt),
    certificateNotAfter: ms(n.certificateNotAfter),
    conditions: n.conditions.map((c) => ({ ...c, since: c.since.getTime() })),
  }));
}
