import { sql, type Transaction } from 'kysely';
import type { Database, Db } from '../../core/database.ts';
import { hostReserveVcpu } from '../../domain/host-limits.ts';
import { newId } from '../../domain/ids.ts';
import {
  type GpusSection,
  type HostSection,
  hostSectionSchema,
  sectionHash,
} from '../../domain/inventory-sections.ts';
import { poolReplicas } from '../../domain/sharing.ts';
import { executePrepared, preparedMarker } from '../pool.ts';
import { setNodeCondition } from './nodes.ts';

type Trx = Transaction<Database>;

/** The validated sections of one inventory message (each optional: only what changed is sent). */
export interface NodeInventorySections {
  gpus?: GpusSection;
  host?: HostSection;
}

/** The latest hash the control plane holds for each inventory section of a node. */
export async function latestSectionHashes(db: Db, nodeId: string): Promise<Map<string, string>> {
  const rows = await sql<{ section: string; hash: string }>`${sql.raw(preparedMarker)}
    SELECT DISTINCT ON (section) section, hash FROM inventory_snapshots
    WHERE node_id = ${nodeId} ORDER BY section, id DESC`.execute(db);
  return new Map(rows.rows.map((r) => [r.section, r.hash]));
}

/**
 * Turns validated inventory into snapshots, devices (GPUs gone from the inventory are marked
 * removed, never deleted), host resource rows, inventory labels and the `GpuCountMismatch`
 * condition, in the caller's transaction (which holds the node's row lock at the session's
 * epoch). Idempotent: the same inventory again leaves the same rows (plus one more snapshot).
 * Every kind of row is written in one statement (a node's first inventory is about a dozen round
 * trips, not one per device, label and resource: a fleet of 10,000 arrives at once).
 */
export async function applyNodeInventory(
  trx: Trx,
  nodeId: string,
  sections: NodeInventorySections,
): Promise<void> {
  const snapshots = Object.entries(sections).map(([name, data]) => ({
    node_id: nodeId,
    section: name,
    hash: sectionHash(data),
    data: JSON.stringify(data),
  }));
  if (snapshots.length > 0) await trx.insertInto('inventory_snapshots').values(snapshots).execute();
  const pool =
    sections.gpus || sections.host
      ? (
          await executePrepared(
            trx,
            trx
              .selectFrom('nodes as n')
              .leftJoin('pools as p', 'p.id', 'n.pool_id')
              .where('n.id', '=', nodeId)
              .select(['p.sharing_mode', 'p.policy', 'n.spec_generation']),
          )
        )[0]
      : undefined;
  const nodePool: NodePool = {
    mode: pool?.sharing_mode ?? 'exclusive',
    policy: (pool?.policy ?? {}) as Record<string, unknown>,
    generation: Number(pool?.spec_generation ?? 0),
  };
  if (sections.gpus) await applyGpus(trx, nodeId, sections.gpus, nodePool);
  if (sections.host) await applyHost(trx, nodeId, sections.host, nodePool);
  if (sections.host) await checkForeignGpuExposure(trx, nodeId, sections.host);
  await checkGpuCount(trx, nodeId, sections.host);
}

/** What the inventory reads of a node's pool: its sharing mode, policy, and the node's NodeSpec generation. */
interface NodePool {
  mode: string;
  policy: Record<string, unknown>;
  generation: number;
}

/**
 * ForeignGpuExposure: the node's bcd reports that something besides it (another device plugin)
 * can hand the node's GPUs to pods. Active reservations on the node show `Degraded` for it; the
 * node stays schedulable and nothing is released.
 */
async function checkForeignGpuExposure(trx: Trx, nodeId: string, host: HostSection): Promise<void> {
  const foreign = host.foreignGpuResources ?? [];
  if (foreign.length > 0) {
    await setNodeCondition(trx, nodeId, {
      type: 'ForeignGpuExposure',
      reason: 'ForeignDevicePlugin',
      message: `the kubelet can hand this node's GPUs to pods through ${foreign.join(', ')}, not only through bcd`,
      effect: null,
    });
  } else {
    await setNodeCondition(trx, nodeId, null, 'ForeignGpuExposure');
  }
}

/** One device row as `upsertDevices` writes it. */
interface DeviceRow {
  class: 'gpu' | 'gpu.mig' | 'gpu.slot';
  stableId: string;
  health: string;
  bookable: boolean;
  parentId: string | null;
  attributes: Record<string, unknown>;
  fromGeneration: number;
}

/**
 * Device rows inserted or brought up to date, in one statement; answers their ids by stable id. A
 * new atom is bookable only from `fromGeneration` (the node's NodeSpec generation now: the node
 * must converge it first). Stable ids are unique within one call (they are within a node).
 */
async function upsertDevices(
  trx: Trx,
  nodeId: string,
  devices: readonly DeviceRow[],
): Promise<Map<string, string>> {
  if (devices.length === 0) return new Map();
  const rows = devices.map(
    (d) => sql`(${newId('dev')}, ${nodeId}, ${d.class}, ${d.stableId}, ${d.health},
      ${JSON.stringify(d.attributes)}::jsonb, ${d.bookable}::boolean, ${d.parentId}::text, ${d.fromGeneration}::bigint)`,
  );
  const { rows: stored } = await sql<{ id: string; stable_id: string }>`
    INSERT INTO devices (id, node_id, class, stable_id, health, attributes, bookable, parent_id, bookable_from_generation)
    VALUES ${sql.join(rows)}
    ON CONFLICT (node_id, stable_id) DO UPDATE SET
      health = EXCLUDED.health, attributes = EXCLUDED.attributes, bookable = EXCLUDED.bookable,
      parent_id = EXCLUDED.parent_id, class = EXCLUDED.class,
      bookable_from_generation = CASE WHEN devices.removed_at IS NULL AND devices.bookable = EXCLUDED.bookable
        THEN devices.bookable_from_generation ELSE EXCLUDED.bookable_from_generation END,
      removed_at = NULL
    RETURNING id, stable_id`.execute(trx);
  return new Map(stored.map((r) => [r.stable_id, r.id]));
}

/**
 * The atoms of the node's GPUs for its pool's sharing mode (domain/sharing.ts): a whole GPU in an
 * exclusive pool; in MIG mode an unbookable parent plus one `gpu.mig` atom per instance, with its
 * profile; in a time-slice or MPS pool an unbookable parent plus `policy.sharing.replicas`
 * `gpu.slot` atoms (`<uuid>-slot-<n>`). Atoms gone from the inventory are marked removed. The
 * GPUs are written in one statement, then their atoms in another.
 */
async function applyGpus(trx: Trx, nodeId: string, section: GpusSection, pool: NodePool): Promise<void> {
  const gpus = section.gpus;
  const { mode, policy } = pool;
  const fromGeneration = pool.generation;
  const slotted = mode === 'time-slice' || mode === 'mps';
  const parentIds = await upsertDevices(
    trx,
    nodeId,
    gpus.map((gpu) => {
      const migOn = gpu.mig?.mode === 'enabled';
      return {
        class: 'gpu',
        stableId: gpu.uuid,
        health: gpu.health,
        bookable: !migOn && !slotted,
        parentId: null,
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
      };
    }),
  );
  const present: string[] = gpus.map((gpu) => gpu.uuid);
  const atoms: DeviceRow[] = [];
  for (const gpu of gpus) {
    const parentId = parentIds.get(gpu.uuid)!;
    if (gpu.mig?.mode === 'enabled') {
      for (const instance of gpu.mig.instances) {
        atoms.push({
          class: 'gpu.mig',
          stableId: instance.uuid,
          health: gpu.health,
          bookable: true,
          parentId,
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
          fromGeneration,
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
          parentId,
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
  await upsertDevices(trx, nodeId, atoms);
  present.push(...atoms.map((a) => a.stableId));
  await sql`${sql.raw(preparedMarker)}
    UPDATE devices SET removed_at = compute_now()
    WHERE node_id = ${nodeId} AND class IN ('gpu', 'gpu.mig', 'gpu.slot') AND removed_at IS NULL
      AND NOT (stable_id = ANY(${present}::text[]))`.execute(trx);
  await executePrepared(
    trx,
    trx.deleteFrom('node_labels').where('node_id', '=', nodeId).where('source', '=', 'inventory'),
  );
  const labels: Array<[string, string]> = [['bc.dev/gpu.count', String(gpus.length)]];
  const model = gpus[0]?.model;
  if (model) labels.push(['bc.dev/gpu.model', model.toLowerCase().replace(/[^a-z0-9.-]+/g, '-')]);
  await trx
    .insertInto('node_labels')
    .values(labels.map(([key, value]) => ({ node_id: nodeId, key, value, source: 'inventory' as const })))
    .execute();
}

/**
 * The host's resource rows: capacity as reported, allocatable vCPU without the host's reserved
 * CPUs (the pool's `policy.hostReserve.vcpu`, default 2), which never go into a cpuset. One statement.
 */
async function applyHost(trx: Trx, nodeId: string, host: HostSection, pool: NodePool): Promise<void> {
  const reserve = host.vcpu > 0 ? hostReserveVcpu(pool.policy) : 0;
  const resources: Array<['vcpu' | 'memoryGiB' | 'hugepages1Gi', number, number]> = [
    ['vcpu', host.vcpu, Math.max(0, host.vcpu - reserve)],
    ['memoryGiB', host.memoryGiB, host.memoryGiB],
    ['hugepages1Gi', host.hugepages1Gi, host.hugepages1Gi],
  ];
  await sql`
    INSERT INTO host_resources (node_id, resource, capacity, allocatable)
    VALUES ${sql.join(resources.map(([resource, amount, allocatable]) => sql`(${nodeId}, ${resource}, ${amount}::numeric, ${allocatable}::numeric)`))}
    ON CONFLICT (node_id, resource) DO UPDATE SET capacity = EXCLUDED.capacity, allocatable = EXCLUDED.allocatable`.execute(
    trx,
  );
}

/**
 * GpuCountMismatch: the driver sees fewer (or more) GPUs than the PCI bus has. `host` is the host
 * section of this inventory when it carries one (else the latest stored one is read, in the same
 * statement as the count of visible GPUs).
 */
async function checkGpuCount(trx: Trx, nodeId: string, host: HostSection | undefined): Promise<void> {
  const { rows } = await sql<{ host: unknown; visible: string }>`${sql.raw(preparedMarker)}
    SELECT (SELECT data FROM inventory_snapshots WHERE node_id = ${nodeId} AND section = 'host'
            AND ${host === undefined} ORDER BY id DESC LIMIT 1) AS host,
           (SELECT count(*) FROM devices WHERE node_id = ${nodeId} AND class = 'gpu' AND removed_at IS NULL) AS visible`.execute(
    trx,
  );
  const stored = host ? null : rows[0]?.host ? hostSectionSchema.safeParse(rows[0].host) : null;
  const pciCount = host ? host.pciGpuCount : stored?.success ? stored.data.pciGpuCount : undefined;
  const visible = Number(rows[0]?.visible ?? 0);
  if (pciCount !== undefined && pciCount !== visible) {
    await setNodeCondition(trx, nodeId, {
      type: 'GpuCountMismatch',
      reason: 'DriverCountDiffers',
      message: `the PCI bus has ${pciCount} GPUs, the driver sees ${visible}`,
      effect: 'NoSchedule',
    });
  } else {
    await setNodeCondition(trx, nodeId, null, 'GpuCountMismatch');
  }
}
