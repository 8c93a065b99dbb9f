import { sql } from 'kysely';
import type { Db } from '../../core/database.ts';
import { endedAllocationStates } from '../../domain/fleet.ts';
import { literalList } from '../sql-literals.ts';

/** One calendar booking on a node: a live allocation whose window starts after compute_now(). */
export interface CalendarBooking {
  reservationId: string;
  tenantId: string;
  allocationId: string;
  start: number;
  end: number;
  /** How many atoms it books on the node. */
  atoms: number;
}

/**
 * The calendar bookings on each of `nodeIds` (allocations not ended whose window starts after
 * compute_now()), soonest first, at most `limit` per node: what an operator must know before taking
 * a node away (BookingRepair will move them). Read-only.
 */
export async function readCalendarBookings(
  db: Db,
  nodeIds: readonly string[],
  limit = 50,
): Promise<Map<string, CalendarBooking[]>> {
  const out = new Map<string, CalendarBooking[]>();
  if (nodeIds.length === 0) return out;
  const { rows } = await sql<{
    node_id: string;
    reservation_id: string;
    tenant_id: string;
    allocation_id: string;
    start: Date;
    end: Date;
    atoms: string;
  }>`
    SELECT * FROM (
      SELECT a.node_id, r.id AS reservation_id, r.tenant_id, a.id AS allocation_id,
             lower(a.during) AS start, upper(a.during) AS "end",
             (SELECT count(*) FROM device_bookings b WHERE b.allocation_id = a.id) AS atoms,
             row_number() OVER (PARTITION BY a.node_id ORDER BY lower(a.during), a.id) AS n
      FROM allocations a JOIN reservations r ON r.id = a.reservation_id
      WHERE a.node_id = ANY(${nodeIds as string[]}::text[])
        AND a.state NOT IN (${literalList(endedAllocationStates)}) AND a.superseded_at IS NULL
        AND lower(a.during) > compute_now()
    ) x WHERE n <= ${limit}
    ORDER BY node_id, start, allocation_id`.execute(db);
  for (const r of rows) {
    const list = out.get(r.node_id) ?? [];
    list.push({
      reservationId: r.reservation_id,
      tenantId: r.tenant_id,
      allocationId: r.allocation_id,
      start: new Date(r.start).getTime(),
      end: new Date(r.end).getTime(),
      atoms: Number(r.atoms),
    });
    out.set(r.node_id, list);
  }
  return out;
}

/**
 * Per node of `nodeIds`: how many calendar bookings it holds and when the soonest starts (nodes
 * without any are absent). Read-only; no reservation ids, so any tenant may see it.
 */
export async function countCalendarBookings(
  db: Db,
  nodeIds: readonly string[],
): Promise<Map<string, { count: number; nextStart: number }>> {
  const out = new Map<string, { count: number; nextStart: number }>();
  if (nodeIds.length === 0) return out;
  const { rows } = await sql<{ node_id: string; count: string; next_start: Date }>`
    SELECT a.node_id, count(*) AS count, min(lower(a.during)) AS next_start
    FROM allocations a
    WHERE a.node_id = ANY(${nodeIds as string[]}::text[]) AND a.reservation_id IS NOT NULL
      AND a.state NOT IN (${literalList(endedAllocationStates)}) AND a.superseded_at IS NULL
      AND lower(a.during) > compute_now()
    GROUP BY a.node_id`.execute(db);
  for (const r of rows) {
    out.set(r.node_id, { count: Number(r.count), nextStart: new Date(r.next_start).getTime() });
  }
  return out;
}
