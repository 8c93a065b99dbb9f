import { sql, type Transaction } from 'kysely';
import { canonicalJson, type DeviceAssignment, normalizeAssignments } from '../domain/node-spec.ts';
import type { Database } from './schema.ts';

type Trx = Transaction<Database>;

export type { DeviceAssignment };

/**
 * Sets or removes `devices` assignments in a node's NodeSpec under the node's row lock, bumping
 * `spec_generation` only when the canonical content changes (idempotent: a retry changes nothing).
 */
export async function changeNodeDeviceAssignments(
  trx: Trx,
  nodeId: string,
  change: { upsert?: readonly DeviceAssignment[]; remove?: readonly string[] },
): Promise<{ generation: number; changed: boolean }> {
  const node = await trx
    .selectFrom('nodes')
    .where('id', '=', nodeId)
    .select(['spec', 'spec_generation'])
    .forUpdate()
    .executeTakeFirstOrThrow();
  const spec = { ...((node.spec ?? {}) as Record<string, unknown>) };
  const before = Array.isArray(spec.devices) ? (spec.devices as DeviceAssignment[]) : [];
  const removed = new Set([...(change.remove ?? []), ...(change.upsert ?? []).map((a) => a.allocationId)]);
  const after = normalizeAssignments([
    ...before.filter((a) => !removed.has(a.allocationId)),
    ...(change.upsert ?? []),
  ]);
  if (canonicalJson(after) === canonicalJson(before)) {
    return { generation: Number(node.spec_generation), changed: false };
  }
  spec.devices = after;
  const row = await trx
    .updateTable('nodes')
    .set({
      spec: JSON.stringify(spec),
      spec_generation: sql<string>`spec_generation + 1`,
      updated_at: sql<Date>`compute_now()`,
    })
    .where('id', '=', nodeId)
    .returning('spec_generation')
    .executeTakeFirstOrThrow();
  return { generation: Number(row.spec_generation), changed: true };
}
