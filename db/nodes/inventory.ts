import { sql, type Transaction } from 'kysely';
import type { Database } from '../../core/database.ts';
import { hostReserveVcpu } from '../../domain/host-limits.ts';
import { newId } from '../../domain/ids.ts';
import { type GpusSection, type HostSection, sectionHash } from '../../domain/inventory-sections.ts';
import { poolReplicas } from '../../domain/sharing.ts';
import { preparedMarker } from '../pool.ts';
import { type NodeConditionChanges, type NodeConditionInput, nodeConditionWrites } from './nodes.ts';
import { readyOnceObserved, type SessionFence } from './sessions.ts';
import { liveReservationIdsOn } from './workloads.ts';

type Trx = Transaction<Database>;

/** The validated sections of one inventory message (each optional: only what changed is sent). */
export interface NodeInventorySections {
  gpus?: GpusSection;
  host?: HostSection;
}

/**
 * Turns validated inventory into snapshots, devices (GPUs gone from the inventory are marked
 * removed, never deleted), host resource rows, inventory labels and the `GpuCountMismatch` and
 * `ForeignGpuExposure` conditions, and makes a joined node that converged a spec `ready`, in the
 * caller's transaction, while the session holds the node's epoch. Answers the live reservations on
 * the node (whose lifecycles should look again), or null (nothing written) when a newer session
 * fenced it. Idempotent: the same inventory again leaves the same rows (plus one more snapshot).
 *
 * Two statements whatever the node reports (a fleet of 10,000 arrives at once): one locks the
 * node's row and reads what the rows depend on (the pool's sharing mode and policy, the node's
 * NodeSpec generation, and for a section not sent the stored GPU count or PCI count) and the live
 * reservations on it; the other writes every kind of row.
 */
export async function applyNodeInventory(
  trx: Trx,
  fence: SessionFence,
  sections: NodeInventorySections,
): Promise<AppliedInventory | null> {
  const { nodeId } = fence;
  const node = await lockNodeForInventory(trx, fence);
  if (!node) return null;
  const { gpus, host } = sections;
  const devices = gpus ? deviceRows(gpus, node) : { gpus: [], atoms: [] };
  const labels: Array<[string, string]> = [];
  if (gpus) {
    labels.push(['bc.dev/gpu.count', String(gpus.gpus.length)]);
    const model = gpus.gpus[0]?.model;
    if (model) labels.push(['bc.dev/gpu.model', model.toLowerCase().replace(/[^a-z0-9.-]+/g, '-')]);
  }
  const resources = host ? hostResources(host, node) : [];
  const snapshots = Object.entries(sections).map(([name, data]) => ({
    section: name,
    hash: sectionHash(data),
    data: JSON.stringify(data),
  }));
  const conditions = inventoryConditions(node, sections);
  const columns = (rows: readonly DeviceRow[]) => ({
    ids: rows.map(() => newId('dev')),
    classes: rows.map((d) => d.class),
    stableIds: rows.map((d) => d.stableId),
    health: rows.map((d) => d.health),
    attributes: rows.map((d) => JSON.stringify(d.attributes)),
    bookable: rows.map((d) => d.bookable),
    fromGeneration: rows.map((d) => d.fromGeneration),
    parents: rows.map((d) => d.parentUuid ?? ''),
  });
  const g = columns(devices.gpus);
  const a = columns(devices.atoms);
  const present = [...g.stableIds, ...a.stableIds];
  // Every CTE sees the rows as they were before the statement: the atoms find their GPU's id in
  // what the GPUs' upsert returned, the removal and the label delete touch only rows not written
  // here, and readiness counts this statement's snapshots as stored.
  await sql`${sql.raw(preparedMarker)}
    WITH snapshots AS (
      INSERT INTO inventory_snapshots (node_id, section, hash, data)
      SELECT ${nodeId}, s.section, s.hash, s.data::jsonb
      FROM unnest(${snapshots.map((x) => x.section)}::text[], ${snapshots.map((x) => x.hash)}::text[],
                  ${snapshots.map((x) => x.data)}::text[]) AS s(section, hash, data)
    ), gpus AS (
      INSERT INTO devices (id, node_id, class, stable_id, health, attributes, bookable, parent_id, bookable_from_generation)
      SELECT d.id, ${nodeId}, d.class, d.stable_id, d.health, d.attributes::jsonb, d.bookable, NULL, d.from_generation
      FROM unnest(${g.ids}::text[], ${g.classes}::text[], ${g.stableIds}::text[], ${g.health}::text[],
                  ${g.attributes}::text[], ${g.bookable}::boolean[], ${g.fromGeneration}::bigint[])
        AS d(id, class, stable_id, health, attributes, bookable, from_generation)
      ON CONFLICT (node_id, stable_id) DO UPDATE SET ${deviceUpdate}
      RETURNING id, stable_id
    ), atoms AS (
      INSERT INTO devices (id, node_id, class, stable_id, health, attributes, bookable, parent_id, bookable_from_generation)
      SELECT d.id, ${nodeId}, d.class, d.stable_id, d.health, d.attributes::jsonb, d.bookable, gpus.id, d.from_generation
      FROM unnest(${a.ids}::text[], ${a.classes}::text[], ${a.stableIds}::text[], ${a.health}::text[],
                  ${a.attributes}::text[], ${a.bookable}::boolean[], ${a.fromGeneration}::bigint[], ${a.parents}::text[])
        AS d(id, class, stable_id, health, attributes, bookable, from_generation, parent_uuid)
      JOIN gpus ON gpus.stable_id = d.parent_uuid
      ON CONFLICT (node_id, stable_id) DO UPDATE SET ${deviceUpdate}
    ), removed AS (
      UPDATE devices SET removed_at = compute_now()
      WHERE ${gpus !== undefined}::boolean AND node_id = ${nodeId} AND class IN ('gpu', 'gpu.mig', 'gpu.slot')
        AND removed_at IS NULL AND NOT (stable_id = ANY(${present}::text[]))
    ), old_labels AS (
      DELETE FROM node_labels
      WHERE ${gpus !== undefined}::boolean AND node_id = ${nodeId} AND source = 'inventory'
        AND NOT (key = ANY(${labels.map(([key]) => key)}::text[]))
    ), new_labels AS (
      INSERT INTO node_labels (node_id, key, value, source)
      SELECT ${nodeId}, l.key, l.value, 'inventory'
      FROM unnest(${labels.map(([key]) => key)}::text[], ${labels.map(([, value]) => value)}::text[]) AS l(key, value)
      ON CONFLICT (node_id, source, key) DO UPDATE SET value = EXCLUDED.value
    ), host AS (
      INSERT INTO host_resources (node_id, resource, capacity, allocatable)
      SELECT ${nodeId}, r.resource, r.capacity, r.allocatable
      FROM unnest(${resources.map((r) => r.resource)}::text[], ${resources.map((r) => r.capacity)}::numeric[],
                  ${resources.map((r) => r.allocatable)}::numeric[]) AS r(resource, capacity, allocatable)
      ON CONFLICT (node_id, resource) DO UPDATE SET capacity = EXCLUDED.capacity, allocatable = EXCLUDED.allocatable
    ), ${nodeConditionWrites(nodeId, conditions)}
    UPDATE nodes SET provision_state = 'ready', updated_at = compute_now()
    WHERE id = ${nodeId} AND ${readyOnceObserved(sql`nodes.observed_generation`, sql`${snapshots.length > 0}::boolean`)}`.execute(
    trx,
  );
  return { liveReservationIds: node.liveReservationIds };
}

/** What an applied inventory answers. */
export interface AppliedInventory {
  /** The live reservations on the node (liveReservationIdsOn), read under its lock. */
  liveReservationIds: string[];
}

/** The update of a device row that an inventory reports again (its id and node stay). */
const deviceUpdate = sql`
  health = EXCLUDED.health, attributes = EXCLUDED.attributes, bookable = EXCLUDED.bookable,
  parent_id = EXCLUDED.parent_id, class = EXCLUDED.class,
  bookable_from_generation = CASE WHEN devices.removed_at IS NULL AND devices.bookable = EXCLUDED.bookable
    THEN devices.bookable_from_generation ELSE EXCLUDED.bookable_from_generation END,
  removed_at = NULL`;

/** What the inventory reads of a node, under its row lock at the session's epoch. */
interface InventoryNode {
  /** The pool's sharing mode and policy. */
  mode: string;
  policy: Record<string, unknown>;
  /** The node's NodeSpec generation. */
  generation: number;
  /** GPUs the driver showed in the stored inventory (not removed). */
  visibleGpus: number;
  /** The PCI bus's GPU count in the latest stored host section, if any. */
  storedPciGpuCount: number | null;
  /** The live reservations on the node (their lifecycles are woken when its health changes). */
  liveReservationIds: string[];
}

async function lockNodeForInventory(trx: Trx, fence: SessionFence): Promise<InventoryNode | null> {
  const { rows } = await sql<{
    sharing_mode: string | null;
    policy: Record<string, unknown> | null;
    spec_generation: string;
    visible: string;
    stored_pci: number | null;
    live_reservations: string[];
  }>`${sql.raw(preparedMarker)}
    SELECT p.sharing_mode, p.policy, n.spec_generation,
      (SELECT count(*) FROM devices d WHERE d.node_id = n.id AND d.class = 'gpu' AND d.removed_at IS NULL) AS visible,
      (SELECT CASE WHEN jsonb_typeof(s.data->'pciGpuCount') = 'number' THEN (s.data->>'pciGpuCount')::int END
       FROM inventory_snapshots s WHERE s.node_id = n.id AND s.section = 'host' ORDER BY s.id DESC LIMIT 1) AS stored_pci,
      ${liveReservationIdsOn(sql`ARRAY[n.id]`)} AS live_reservations
    FROM nodes n LEFT JOIN pools p ON p.id = n.pool_id
    WHERE n.id = ${fence.nodeId} AND n.epoch = ${fence.epoch}
    FOR NO KEY UPDATE OF n`.execute(trx);
  const row = rows[0];
  if (!row) return null;
  return {
    mode: row.sharing_mode ?? 'exclusive',
    policy: row.policy ?? {},
    generation: Number(row.spec_generation),
    visibleGpus: Number(row.visible),
    storedPciGpuCount: row.stored_pci,
    liveReservationIds: row.live_reservations,
  };
}

/**
 * The inventory's conditions, set or cleared:
 * - GpuCountMismatch: the driver sees fewer (or more) GPUs than the PCI bus has (each count from
 *   this inventory when it carries that section, else as stored);
 * - ForeignGpuExposure (only when the host section is sent): the node's bcd reports that something
 *   besides it (another device plugin) can hand the node's GPUs to pods. Active reservations on
 *   the node show `Degraded` for it; the node stays schedulable and nothing is released.
 */
function inventoryConditions(node: InventoryNode, sections: NodeInventorySections): NodeConditionChanges {
  const changes = { set: [] as NodeConditionInput[], clear: [] as string[] };
  const visible = sections.gpus ? sections.gpus.gpus.length : node.visibleGpus;
  const pciCount = sections.host ? sections.host.pciGpuCount : node.storedPciGpuCount;
  if (pciCount !== null && pciCount !== visible) {
    changes.set.push({
      type: 'GpuCountMismatch',
      reason: 'DriverCountDiffers',
      message: `the PCI bus has ${pciCount} GPUs, the driver sees ${visible}`,
      effect: 'NoSchedule',
    });
  } else {
    changes.clear.push('GpuCountMismatch');
  }
  const foreign = sections.host?.foreignGpuResources ?? [];
  if (foreign.length > 0) {
    changes.set.push({
      type: 'ForeignGpuExposure',
      reason: 'ForeignDevicePlugin',
      message: `the kubelet can hand this node's GPUs to pods through ${foreign.join(', ')}, not only through bcd`,
      effect: null,
    });
  } else if (sections.host) {
    changes.clear.push('ForeignGpuExposure');
  }
  return changes;
}

/** One device row as the inventory writes it. */
interface DeviceRow {
  class: 'gpu' | 'gpu.mig' | 'gpu.slot';
  stableId: string;
  health: string;
  bookable: boolean;
  /** An atom's GPU (its `parent_id` is that GPU's row). */
  parentUuid?: string;
  attributes: Record<string, unknown>;
  fromGeneration: number;
}

/**
 * The device rows of the node's GPUs for its pool's sharing mode (domain/sharing.ts): a whole GPU
 * in an exclusive pool; in MIG mode an unbookable parent plus one `gpu.mig` atom per instance, with
 * its profile; in a time-slice or MPS pool an unbookable parent plus `policy.sharing.replicas`
 * `gpu.slot` atoms (`<uuid>-slot-<n>`). A new MIG atom is bookable only from the node's NodeSpec
 * generation now (the node must converge it first). Stable ids are unique within one inventory
 * (they are within a node).
 */
function deviceRows(section: GpusSection, node: InventoryNode): { gpus: DeviceRow[]; atoms: DeviceRow[] } {
  const { mode, policy } = node;
  const slotted = mode === 'time-slice' || mode === 'mps';
  const gpus: DeviceRow[] = [];
  const atoms: DeviceRow[] = [];
  for (const gpu of section.gpus) {
    const migOn = gpu.mig?.mode === 'enabled';
    gpus.push({
      class: 'gpu',
      stableId: gpu.uuid,
      health: gpu.health,
      bookable: !migOn && !slotted,
      attributes: {
        model: gpu.model,
        memoryMiB: gpu.memoryMiB,
        nvlinkDomain: gpu.nvlinkDomain,
        numaNode: gpu.numaNode,
        index: gpu.index,
        ...(gpu.pciBusId ? { pciBusId: gpu.pciBusId } : {}),
        ...(migOn ? { migMode: 'enabled' } : {}),
      },
      fromGeneration: 0,
    });
    if (gpu.mig?.mode === 'enabled') {
      for (const instance of gpu.mig.instances) {
        atoms.push({
          class: 'gpu.mig',
          stableId: instance.uuid,
          health: gpu.health,
          bookable: true,
          parentUuid: gpu.uuid,
          attributes: {
            model: gpu.model,
            profile: instance.profile,
            memoryMiB: instance.memoryMiB,
            gpuInstanceId: instance.gpuInstanceId,
            computeInstanceId: instance.computeInstanceId,
            parentUuid: gpu.uuid,
            nvlinkDomain: null,
            numaNode: gpu.numaNode,
            index: gpu.index * 8 + instance.gpuInstanceId,
          },
          fromGeneration: node.generation,
        });
      }
    } else if (slotted) {
      const replicas = poolReplicas(mode, policy);
      for (let slot = 0; slot < replicas; slot++) {
        atoms.push({
          class: 'gpu.slot',
          stableId: `${gpu.uuid}-slot-${slot}`,
          health: gpu.health,
          bookable: true,
          parentUuid: gpu.uuid,
          attributes: {
            model: gpu.model,
            sharing: mode,
            slot,
            replicas,
            parentUuid: gpu.uuid,
            nvlinkDomain: null,
            numaNode: gpu.numaNode,
            index: gpu.index * 64 + slot,
          },
          fromGeneration: 0,
        });
      }
    }
  }
  return { gpus, atoms };
}

/**
 * The host's resource rows: capacity as reported, allocatable vCPU without the host's reserved
 * CPUs (the pool's `policy.hostReserve.vcpu`, default 2), which never go into a cpuset.
 */
function hostResources(
  host: HostSection,
  node: InventoryNode,
): Array<{ resource: 'vcpu' | 'memoryGiB' | 'hugepages1Gi'; capacity: number; allocatable: number }> {
  const reserve = host.vcpu > 0 ? hostReserveVcpu(node.policy) : 0;
  return [
    { resource: 'vcpu', capacity: host.vcpu, allocatable: Math.max(0, host.vcpu - reserve) },
    { resource: 'memoryGiB', capacity: host.memoryGiB, allocatable: host.memoryGiB },
    { resource: 'hugepages1Gi', capacity: host.hugepages1Gi, allocatable: host.hugepages1Gi },
  ];
}
