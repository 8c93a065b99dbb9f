import { sql, type Transaction } from 'kysely';
import type { Database, Db } from '../../core/database.ts';
import { newId } from '../../domain/ids.ts';
import {
  type GpusSection,
  type HostSection,
  hostSectionSchema,
  sectionHash,
} from '../../domain/inventory-sections.ts';
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
  await checkGpuCount(trx, nodeId);
}

async function applyGpus(trx: Trx, nodeId: string, section: GpusSection): Promise<void> {
  const gpus = section.gpus;
  for (const gpu of gpus) {
    const attributes = JSON.stringify({
      model: gpu.model,
      memoryMiB: gpu.memoryMiB,
      nvlinkDomain: gpu.nvlinkDomain,
      numaNode: gpu.numaNode,
      index: gpu.index,
      ...(gpu.pciBusId ? { pciBusId: gpu.pciBusId } : {}),
    });
    await sql`
      INSERT INTO devices (id, node_id, class, stable_id, health, attributes)
      VALUES (${newId('dev')}, ${nodeId}, 'gpu', ${gpu.uuid}, ${gpu.health}, ${attributes}::jsonb)
      ON CONFLICT (node_id, stable_id) DO UPDATE SET
        health = EXCLUDED.health, attributes = EXCLUDED.attributes, removed_at = NULL`.execute(trx);
  }
  const uuids = gpus.map((g) => g.uuid);
  await sql`
    UPDATE devices SET removed_at = compute_now()
    WHERE node_id = ${nodeId} AND class = 'gpu' AND removed_at IS NULL
      AND NOT (stable_id = ANY(${uuids}::text[]))`.execute(trx);
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

async function applyHost(trx: Trx, nodeId: string, host: HostSection): Promise<void> {
  const resources: Array<['vcpu' | 'memoryGiB' | 'hugepages1Gi', number]> = [
    ['vcpu', host.vcpu],
    ['memoryGiB', host.memoryGiB],
    ['hugepages1Gi', host.hugepages1Gi],
  ];
  for (const [resource, amount] of resources) {
    await sql`
      INSERT INTO host_resources (node_id, resource, capacity, allocatable)
      VALUES (${nodeId}, ${resource}, ${amount}, ${amount})
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
