import type { Transaction } from 'kysely';
import type { DeviceAssignment } from '../domain/node-spec.ts';
import { setNodeDevicesAssignment } from './nodes.ts';
import type { Database } from './schema.ts';

type Trx = Transaction<Database>;

export type { DeviceAssignment };

/**
 * Adds or withdraws `devices` assignments in a node's NodeSpec, keeping every other allocation's:
 * the node's row is locked first, so two reservations on one node never lose each other's
 * assignment, and the write goes through `setNodeDevicesAssignment` (new generation only when the
 * canonical spec changes; idempotent).
 */
export async function changeNodeDeviceAssignments(
  trx: Trx,
  nodeId: string,
  change: { upsert?: readonly DeviceAssignment[]; remove?: readonly string[] },
): Promise<{ generation: number; changed: boolean }> {
  const node = await trx
    .selectFrom('nodes')
    .where('id', '=', nodeId)
    .select('spec')
    .forUpdate()
    .executeTakeFirstOrThrow();
  const spec = (node.spec ?? {}) as Record<string, unknown>;
  const before = Array.isArray(spec.devices) ? (spec.devices as DeviceAssignment[]) : [];
  const replaced = new Set([...(change.remove ?? []), ...(change.upsert ?? []).map((a) => a.allocationId)]);
  return setNodeDevicesAssignment(trx, nodeId, [
    ...before.filter((a) => !replaced.has(a.allocationId)),
    ...(change.upsert ?? []),
  ]);
}
