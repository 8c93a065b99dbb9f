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
import { setNodeCondition } from './nodes.ts';

type Trx = Transaction<Database>;

/** The validated sections of one inventory message (each optional: only what changed is sent). */
export interface NodeInventorySections {
  gpus?: GpusSection;
  host?: HostSection;
}

/** The latest hash the control plane holds for each inventory section of a node. */
export async function latestSectionHashes(db: Db, nodeId: string): Promise<Map<string, string>> {
  const rows = await sql<{ section: string; hash: string }>`
    SELECT DISTINCT ON (section) section, hash FROM inventory_snapshots
    WHERE node_id = ${nodeId} ORDER BY section, id DESC`.execute(db);
  return new Map(rows.rows.map((r) => [r.section, r.hash]));
}

/**
 * Turns validated inventory into snapshots, devices (GPUs gone from the inventory are marked
 * removed, never deleted), host resource rows, inventory labels and the `GpuCountMismatch`
 * condition, in the caller's transaction (which holds the node's row lock at the session's
 * epoch). Idempotent: the same inventory again leaves the same rows (plus one more snapshot).
 */
export async function applyNodeInventory(
  trx: Trx,
  nodeId: string,
  sections: NodeInventorySections,
): Promise<void> {
  for (const [name, data] of Object.entries(sections)) {
    await trx
      .insertInto('inventory_snapshots')
      .values({ node_id: nodeId, section: name, hash: sectionHash(data), data: JSON.stringify(data) })
      .execute();
  }
  if (sections.gpus) await applyGpus(trx, nodeId, sections.gpus);
  if (sections.host) await applyHost(trx, nodeId, sections.host);
  if (sections.host) await checkForeignGpuExposure(trx, nodeId, sections.host);
  await checkGpuCount(trx, nodeId);
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

/**
 * One device row, inserted or brought up to date; answers its id. A new atom is bookable only from
 * `fromGeneration` (the node's NodeSpec generation now: the node must converge it first).
 */
async function upsertDevice(
  trx: Trx,
  nodeId: string,
  device: {
    class: 'gpu' | 'gpu.mig' | 'gpu.slot';
    stableId: string;
    health: string;
    bookable: boolean;
    parentId: string | null;
    attributes: Record<string, unknown>;
    fromGeneration: number;
  },
): Promise<string> {
  const { rows } = await sql<{ id: string }>`
    INSERT INTO devices (id, node_id, class, stable_id, health, attributes, bookable, parent_id, bookable_from_generation)
    VALUES (${newId('dev')}, ${nodeId}, ${device.class}, ${device.stableId}, ${device.health},
            ${JSON.stringify(device.attributes)}::jsonb, ${device.bookable}, ${device.parentId}, ${device.fromGeneration})
    ON CONFLICT (node_id, stable_id) DO UPDATE SET
      health = EXCLUDED.health, attributes = EXCLUDED.attributes, bookable = EXCLUDED.bookable,
      parent_id = EXCLUDED.parent_id, class = EXCLUDED.class,
      bookable_from_generation = CASE WHEN devices.removed_at IS NULL AND devices.bookable = EXCLUDED.bookable
        THEN devices.bookable_from_generation ELSE EXCLUDED.bookable_from_generation END,
      removed_at = NULL
    RETURNING id`.execute(trx);
  return rows[0]!.id;
}

/**
 * The atoms of the node's GPUs for its pool's sharing mode (domain/sharing.ts): a whole GPU in an
 * exclusive pool; in MIG mode an unbookable parent plus one `gpu.mig` atom per instance, with its
 * profile; in a time-slice or MPS pool an unbookable parent plus `policy.sharing.replicas`
 * `gpu.slot` atoms (`<uuid>-slot-<n>`). Atoms gone from the inventory are marked removed.
 */
async function applyGpus(trx: Trx, nodeId: string, section: GpusSection): Promise<void> {
  const gpus = section.gpus;
  const pool = await trx
    .selectFrom('nodes as n')
    .leftJoin('pools as p', 'p.id', 'n.pool_id')
    .where('n.id', '=', nodeId)
    .select(['p.sharing_mode', 'p.policy', 'n.spec_generation'])
    .executeTakeFirst();
  const mode = pool?.sharing_mode ?? 'exclusive';
  const policy = (pool?.policy ?? {}) as Record<string, unknown>;
  const fromGeneration = Number(pool?.spec_generation ?? 0);
  const present: string[] = [];
  for (const gpu of gpus) {
    const base = {
      model: gpu.model,
      memoryMiB: gpu.memoryMiB,
      nvlinkDomain: gpu.nvlinkDomain,
      numaNode: gpu.numaNode,
      index: gpu.index,
      ...(gpu.pciBusId ? { pciBusId: gpu.pciBusId } : {}),
    };
    const migOn = gpu.mig?.mode === 'enabled';
    const slotted = mode === 'time-slice' || mode === 'mps';
    const parentId = await upsertDevice(trx, nodeId, {
      class: 'gpu',
      stableId: gpu.uuid,
      health: gpu.health,
      bookable: !migOn && !slotted,
      parentId: null,
      attributes: { ...base, ...(migOn ? { migMode: 'enabled' } : {}) },
      fromGeneration: 0,
    });
    present.push(gpu.uuid);
    if (migOn) {
      for (const instance of gpu.mig!.instances) {
        await upsertDevice(trx, nodeId, {
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
        present.push(instance.uuid);
      }
    } else if (slotted) {
      const replicas = poolReplicas(mode, policy);
      for (let slot = 0; slot < replicas; slot++) {
        const stableId = `${gpu.uuid}-slot-${slot}`;
        await upsertDevice(trx, nodeId, {
          class: 'gpu.slot',
          stableId,
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
        present.push(stableId);
      }
    }
  }
  await sql`
    UPDATE devices SET removed_at = compute_now()
    WHERE node_id = ${nodeId} AND class IN ('gpu', 'gpu.mig', 'gpu.slot') AND removed_at IS NULL
      AND NOT (stable_id = ANY(${present}::text[]))`.execute(trx);
  await trx
    .deleteFrom('node_labels')
    .where('node_id', '=', nodeId)
    .where('source', '=', 'inventory')
    .execute();
  const labels: Array<[string, string]> = [['bc.dev/gpu.count', String(gpus.length)]];
  const model = gpus[0]?.model;
  if (model) labels.push(['bc.dev/gpu.model', model.toLowerCase().replace(/[^a-z0-9.-]+/g, '-')]);
  for (const [key, value] of labels) {
    await trx
      .insertInto('node_labels')
      .values({ node_id: nodeId, key, value, source: 'inventory' })
      .execute();
  }
}

/**
 * The host's resource rows: capacity as reported, allocatable vCPU without the host's reserved
 * CPUs (the pool's `policy.hostReserve.vcpu`, default 2), which never go into a cpuset.
 */
async function applyHost(trx: Trx, nodeId: string, host: HostSection): Promise<void> {
  const pool = await trx
    .selectFrom('nodes as n')
    .leftJoin('pools as p', 'p.id', 'n.pool_id')
    .where('n.id', '=', nodeId)
    .select(['p.policy'])
    .executeTakeFirst();
  const reserve = host.vcpu > 0 ? hostReserveVcpu((pool?.policy ?? {}) as Record<string, unknown>) : 0;
  const resources: Array<['vcpu' | 'memoryGiB' | 'hugepages1Gi', number, number]> = [
    ['vcpu', host.vcpu, Math.max(0, host.vcpu - reserve)],
    ['memoryGiB', host.memoryGiB, host.memoryGiB],
    ['hugepages1Gi', host.hugepages1Gi, host.hugepages1Gi],
  ];
  for (const [resource, amount, allocatable] of resources) {
    await sql`
      INSERT INTO host_resources (node_id, resource, capacity, allocatable)
      VALUES (${nodeId}, ${resource}, ${amount}, ${allocatable})
      ON CONFLICT (node_id, resource) DO UPDATE SET capacity = EXCLUDED.capacity, allocatable = EXCLUDED.allocatable`.execute(
      trx,
    );
  }
}

/** GpuCountMismatch: the driver sees fewer (or more) GPUs than the PCI bus has. */
async function checkGpuCount(trx: Trx, nodeId: string): Promise<void> {
  const latestHost = await trx
    .selectFrom('inventory_snapshots')
    .where('node_id', '=', nodeId)
    .where('section', '=', 'host')
    .orderBy('id', 'desc')
    .select(['data'])
    .limit(1)
    .executeTakeFirst();
  const host = latestHost ? hostSectionSchema.safeParse(latestHost.data) : null;
  const pciCount = host?.success ? host.data.pciGpuCount : undefined;
  const gpuCount = await trx
    .selectFrom('devices')
    .where('node_id', '=', nodeId)
    .where('class', '=', 'gpu')
    .where('removed_at', 'is', null)
    .select((eb) => eb.fn.countAll<string>().as('n'))
    .executeTakeFirstOrThrow();
  const visible = Number(gpuCount.n);
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
