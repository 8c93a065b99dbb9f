import { type RawBuilder, sql } from 'kysely';
import type { Db } from '../../core/database.ts';
import { endedAllocationStates, holdingAllocationStates } from '../../domain/fleet.ts';
import { holdingStates } from '../../domain/reservation-states.ts';
import { literalList } from '../sql-literals.ts';

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
 * The live reservations (`holdingStates`) holding a live allocation on any of the nodes `nodeIds`
 * (an SQL `text[]`), as an SQL array of their ids: the lifecycles to wake when a node's
 * connectivity or health changes. A part of a larger statement (the inventory's read) or its own.
 */
export function liveReservationIdsOn(nodeIds: RawBuilder<unknown>): RawBuilder<string[]> {
  return sql<string[]>`(SELECT COALESCE(array_agg(DISTINCT r.id), '{}') FROM allocations a
    JOIN reservations r ON r.id = a.reservation_id
    WHERE a.node_id = ANY(${nodeIds}) AND a.state IN (${literalList(holdingAllocationStates)})
      AND r.state IN (${literalList(holdingStates)}))`;
}

/** liveReservationIdsOn these nodes, read on their own. */
export async function findLiveReservationsOnNodes(db: Db, nodeIds: readonly string[]): Promise<string[]> {
  if (nodeIds.length === 0) return [];
  const { rows } = await sql<{ ids: string[] }>`
    SELECT ${liveReservationIdsOn(sql`${[...nodeIds]}::text[]`)} AS ids`.execute(db);
  return rows[0]?.ids ?? [];
}
