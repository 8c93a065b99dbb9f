import { sql, type Transaction } from 'kysely';
import type { Database } from '../../core/database.ts';
import { holdingAllocationStates } from '../../domain/fleet.ts';
import type { DeviceAssignment } from '../../domain/node-spec.ts';
import { holdTermsOf } from '../allocations/hold-terms.ts';
import { setNodeDevicesAssignment } from '../nodes/nodes.ts';

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
    .forNoKeyUpdate()
    .executeTakeFirstOrThrow();
  const spec = (node.spec ?? {}) as Record<string, unknown>;
  const before = Array.isArray(spec.devices) ? (spec.devices as DeviceAssignment[]) : [];
  const replaced = new Set([...(change.remove ?? []), ...(change.upsert ?? []).map((a) => a.allocationId)]);
  return setNodeDevicesAssignment(trx, nodeId, [
    ...before.filter((a) => !replaced.has(a.allocationId)),
    ...(change.upsert ?? []),
  ]);
}

/**
 * Withdraws `allocations` from their nodes' NodeSpecs through `changeNodeDeviceAssignments`, one
 * node at a time in node-id order (so concurrent callers lock node rows in one order). Idempotent:
 * an allocation a NodeSpec no longer holds changes nothing. Answers the nodes touched, sorted.
 */
export async function withdrawNodeDeviceAssignments(
  trx: Trx,
  allocations: ReadonlyArray<{ id: string; node_id: string }>,
): Promise<string[]> {
  const byNode = new Map<string, string[]>();
  for (const a of allocations) byNode.set(a.node_id, [...(byNode.get(a.node_id) ?? []), a.id]);
  const nodeIds = [...byNode.keys()].sort();
  for (const nodeId of nodeIds) {
    await changeNodeDeviceAssignments(trx, nodeId, { remove: byNode.get(nodeId)! });
  }
  return nodeIds;
}

/**
 * Writes the `devices` assignment of every allocation of a reservation's current placement that
 * the node should hold (planned, binding or bound), with `until` at the allocation's end, into each
 * node's NodeSpec. Idempotent; used at the start of binding and whenever an extend moved the end.
 * Answers the nodes it touched.
 */
export async function assignReservationDevices(
  trx: Trx,
  reservationId: string,
  binding: 'hold' | 'kubernetes',
): Promise<string[]> {
  const rows = await trx
    .selectFrom('allocations as a')
    .leftJoin('device_bookings as b', 'b.allocation_id', 'a.id')
    .leftJoin('devices as d', 'd.id', 'b.device_id')
    .innerJoin('reservations as r', 'r.id', 'a.reservation_id')
    .where('a.reservation_id', '=', reservationId)
    .where('a.superseded_at', 'is', null)
    .where('a.state', 'in', holdingAllocationStates)
    .select([
      'a.id',
      'a.node_id',
      'd.id as device_id',
      'd.stable_id',
      sql<Date>`upper(a.during)`.as('until'),
      // A spot reservation under a preemption notice: the node tells the workload when it ends.
      'r.preempt_notice_until',
    ])
    .orderBy('a.id')
    .orderBy('d.stable_id')
    .execute();
  const byNode = new Map<string, Map<string, DeviceAssignment>>();
  for (const row of rows) {
    const node = byNode.get(row.node_id) ?? new Map<string, DeviceAssignment>();
    byNode.set(row.node_id, node);
    const assignment = node.get(row.id) ?? {
      allocationId: row.id,
      deviceIds: [],
      stableIds: [],
      until: new Date(row.until).getTime(),
      binding,
      ...(row.preempt_notice_until ? { preemptAt: new Date(row.preempt_notice_until).getTime() } : {}),
    };
    node.set(row.id, assignment);
    if (row.device_id && row.stable_id) {
      assignment.deviceIds.push(row.device_id);
      assignment.stableIds.push(row.stable_id);
    }
  }
  // What the node enforces beside the devices: limits and cpuset, and a shared pool's settings.
  const terms = await holdTermsOf(
    trx,
    [...byNode.values()].flatMap((m) => [...m.keys()]),
  );
  for (const node of byNode.values()) {
    for (const [id, assignment] of node) node.set(id, { ...assignment, ...terms.get(id) });
  }
  const nodeIds = [...byNode.keys()].sort();
  for (const nodeId of nodeIds) {
    await changeNodeDeviceAssignments(trx, nodeId, { upsert: [...byNode.get(nodeId)!.values()] });
  }
  return nodeIds;
}
