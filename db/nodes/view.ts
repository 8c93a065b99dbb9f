import type { Db, DeviceAttributes } from '../../core/database.ts';
import type { Connectivity, DeviceClass, NodeRole, ProvisionState } from '../../domain/fleet.ts';
import { latestCertificateExpiries } from './certificates.ts';
import { taintConditionPrefix } from './taints.ts';

/** A node as operators read it: its state axes, labels, conditions, session and devices. */
export interface NodeDetail {
  id: string;
  name: string;
  siteId: string;
  poolId: string | null;
  role: NodeRole;
  provisionState: ProvisionState;
  cordoned: boolean;
  cordonReason: string | null;
  draining: boolean;
  /** When the drain finished (its last allocation ended); null while it runs or without one. */
  drainedAt: Date | null;
  /** The operator's taints (named NoSchedule reasons), also listed among the conditions. */
  taints: string[];
  maintenance: boolean;
  maintenanceReason: string | null;
  connectivity: Connectivity;
  epoch: number;
  lastHeartbeatAt: Date | null;
  agentVersion: string | null;
  capabilities: string[];
  specGeneration: number;
  observedGeneration: number | null;
  /** The latest expiry among the node's unrevoked certificates. */
  certificateNotAfter: Date | null;
  labels: Array<{ key: string; value: string; source: string }>;
  conditions: Array<{ type: string; reason: string; message: string; effect: string | null; since: Date }>;
  gpuCount: number;
  /** Devices not removed, by stable id; only when asked for. */
  devices?: Array<{
    id: string;
    class: DeviceClass;
    stableId: string;
    health: string;
    attributes: DeviceAttributes;
  }>;
}

/** Reads nodes with their labels, conditions, GPU count (and devices), in the order of `ids`. */
export async function readNodeDetails(
  db: Db,
  ids: readonly string[],
  options: { devices: boolean },
): Promise<NodeDetail[]> {
  if (ids.length === 0) return [];
  const [nodes, labels, conditions, devices, certificateExpiries] = await Promise.all([
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
    latestCertificateExpiries(db, ids),
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
        drainedAt: n.drained_at,
        taints: conditions
          .filter((c) => c.node_id === id && c.type.startsWith(taintConditionPrefix))
          .map((c) => c.type.slice(taintConditionPrefix.length)),
        maintenance: n.maintenance,
        maintenanceReason: n.maintenance_reason,
        connectivity: n.connectivity,
        epoch: Number(n.epoch),
        lastHeartbeatAt: n.last_heartbeat_at,
        agentVersion: n.agent_version,
        capabilities: n.capabilities,
        specGeneration: Number(n.spec_generation),
        observedGeneration: n.observed_generation === null ? null : Number(n.observed_generation),
        certificateNotAfter: certificateExpiries.get(id) ?? null,
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
            since: c.since,
          })),
        gpuCount: own.filter((d) => d.class === 'gpu').length,
        ...(options.devices
          ? {
              devices: own.map((d) => ({
                id: d.id,
                class: d.class,
                stableId: d.stable_id,
                health: d.health,
                attributes: d.attributes,
              })),
            }
          : {}),
      },
    ];
  });
}
