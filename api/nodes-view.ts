import { sql } from 'kysely';
import { z } from 'zod';
import type { Db } from '../core/database.ts';

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
  if (ids.length === 0) return [];
  const [nodes, labels, conditions, devices, certs] = await Promise.all([
    db.selectFrom('nodes').selectAll().where('id', 'in', ids).execute(),
    db.selectFrom('node_labels').selectAll().where('node_id', 'in', ids).orderBy('key').execute(),
    db.selectFrom('node_conditions').selectAll().where('node_id', 'in', ids).orderBy('type').execute(),
    db
      .selectFrom('devices')
      .select(['id', 'node_id', 'class', 'stable_id', 'health', 'attributes'])
      .where('node_id', 'in', ids)
      .where('removed_at', 'is', null)
      .orderBy('stable_id')
      .execute(),
    db
      .selectFrom('node_certificates')
      .select(['node_id', sql<Date>`max(not_after)`.as('not_after')])
      .where('node_id', 'in', ids)
      .where('revoked_at', 'is', null)
      .groupBy('node_id')
      .execute(),
  ]);
  const byId = new Map(nodes.map((n) => [n.id, n]));
  return ids.flatMap((id) => {
    const n = byId.get(id);
    if (!n) return [];
    const own = devices.filter((d) => d.node_id === id);
    return [
      {
        id: n.id,
        name: n.name,
        siteId: n.site_id,
        poolId: n.pool_id,
        role: n.role,
        provisionState: n.provision_state,
        cordoned: n.cordoned,
        cordonReason: n.cordon_reason,
        draining: n.draining,
        maintenance: n.maintenance,
        connectivity: n.connectivity,
        epoch: Number(n.epoch),
        lastHeartbeatAt: ms(n.last_heartbeat_at),
        agentVersion: n.agent_version,
        capabilities: n.capabilities,
        specGeneration: Number(n.spec_generation),
        observedGeneration: n.observed_generation === null ? null : Number(n.observed_generation),
        certificateNotAfter: ms(certs.find((c) => c.node_id === id)?.not_after),
        labels: labels
          .filter((l) => l.node_id === id)
          .map((l) => ({ key: l.key, value: l.value, source: l.source })),
        conditions: conditions
          .filter((c) => c.node_id === id)
          .map((c) => ({
            type: c.type,
            reason: c.reason,
            message: c.message,
            effect: c.effect,
            since: c.since.getTime(),
          })),
        gpuCount: own.filter((d) => d.class === 'gpu').length,
        ...(options.devices
          ? {
              devices: own.map((d) => ({
                id: d.id,
                class: d.class,
                stableId: d.stable_id,
                health: d.health,
                attributes: d.attributes as Record<string, unknown>,
              })),
            }
          : {}),
      },
    ];
  });
}
