import { sql } from 'kysely';
import type { Db } from '../core/database.ts';
import { setNodeCondition } from '../db/nodes/nodes.ts';
import { ComputeError } from '../domain/errors.ts';
import { newId } from '../domain/ids.ts';
import {
  type GpusSection,
  type HostSection,
  inventorySections,
  isInventorySectionName,
  sectionHash,
} from '../domain/inventory-sections.ts';
import type { InventorySection } from '../proto/gen/agent/v1/agent.ts';
import { sessionFenced } from './fence.ts';

/** The latest hash the control plane holds for each inventory section of a node. */
export async function latestSectionHashes(db: Db, nodeId: string): Promise<Map<string, string>> {
  const rows = await sql<{ section: string; hash: string }>`
    SELECT DISTINCT ON (section) section, hash FROM inventory_snapshots
    WHERE node_id = ${nodeId} ORDER BY section, id DESC`.execute(db);
  return new Map(rows.rows.map((r) => [r.section, r.hash]));
}

interface ParsedSections {
  gpus?: GpusSection;
  host?: HostSection;
}

/** Validates sections before anything is written: unknown names, bad JSON or a wrong hash refuse all. */
export function parseInventory(sections: readonly InventorySection[]): ParsedSections {
  const out: ParsedSections = {};
  for (const section of sections) {
    if (!isInventorySectionName(section.name)) {
      throw new ComputeError('INVALID_INPUT', `unknown inventory section ${section.name.slice(0, 50)}`);
    }
    let json: unknown;
    try {
      json = JSON.parse(Buffer.from(section.data).toString('utf8'));
    } catch {
      throw new ComputeError('INVALID_INPUT', `inventory section ${section.name} is not JSON`);
    }
    const parsed = inventorySections[section.name].safeParse(json);
    if (!parsed.success) {
      throw new ComputeError(
        'INVALID_INPUT',
        `inventory section ${section.name}: ${parsed.error.issues[0]?.message}`,
      );
    }
    if (sectionHash(parsed.data) !== section.hash) {
      throw new ComputeError('INVALID_INPUT', `inventory section ${section.name} does not match its hash`);
    }
    (out as Record<string, unknown>)[section.name] = parsed.data;
  }
  return out;
}

/**
 * Turns inventory into devices, host resource rows, labels and conditions, in one transaction
 * fenced by the session's epoch (a fenced session changes nothing: INVALID_STATE).
 */
export async function applyInventory(
  db: Db,
  input: { nodeId: string; epoch: number; sections: ParsedSections },
): Promise<void> {
  const { nodeId, sections } = input;
  await db.transaction().execute(async (trx) => {
    const node = await trx
      .selectFrom('nodes')
      .where('id', '=', nodeId)
      .where('epoch', '=', String(input.epoch))
      .select(['id'])
      .forUpdate()
      .executeTakeFirst();
    if (!node) throw sessionFenced();
    for (const [name, data] of Object.entries(sections)) {
      await trx
        .insertInto('inventory_snapshots')
        .values({ node_id: nodeId, section: name, hash: sectionHash(data), data: JSON.stringify(data) })
        .execute();
    }
    if (sections.gpus) {
      const gpus = sections.gpus.gpus;
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
    if (sections.host) {
      const host = sections.host;
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
    // GpuCountMismatch: the driver sees fewer (or more) GPUs than the PCI bus has.
    const hashes = await trx
      .selectFrom('inventory_snapshots')
      .where('node_id', '=', nodeId)
      .where('section', '=', 'host')
      .orderBy('id', 'desc')
      .select(['data'])
      .limit(1)
      .executeTakeFirst();
    const pciCount = (hashes?.data as HostSection | undefined)?.pciGpuCount;
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
  });
}
