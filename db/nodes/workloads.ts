import type { Db } from '../../core/database.ts';
import { endedAllocationStates, holdingAllocationStates } from '../../domain/fleet.ts';
import { holdingStates } from '../../domain/reservation-states.ts';

/** What runs on nodes: their allocations and the reservations that hold them. */

/** How many of a node's allocations are not yet released or failed. */
export async function countLiveAllocations(db: Db, nodeId: string): Promise<number> {
  const live = await db
    .selectFrom('allocations')
    .select((eb) => eb.fn.countAll<string>().as('n'))
    .where('node_id', '=', nodeId)
    .where('state', 'not in', endedAllocationStates)
    .executeTakeFirstOrThrow();
  return Number(live.n);
}

/**
 * The live reservations (`holdingStates`) holding a live allocation on any of these
 * nodes: the lifecycles to wake when a node's connectivity or health changes.
 */
export async function findLiveReservationsOnNodes(db: Db, nodeIds: readonly string[]): Promise<string[]> {
  if (nodeIds.length === 0) return [];
  const rows = await db
    .selectFrom('allocations as a')
    .innerJoin('reservations as r', 'r.id', 'a.reservation_id')
    .select('r.id')
    .distinct()
    .where('a.node_id', 'in', nodeIds)
    .where('a.state', 'in', holdingAllocationStates)
    .where('r.state', 'in', holdingStates)
    .execute();
  return rows.map((r) => r.id);
}
