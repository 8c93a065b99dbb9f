import { sql } from 'kysely';
import type { Db } from '../../core/database.ts';
import { bookingOfDevice, hostBookingOfNode } from './bookings.ts';

export interface BookingInvariantReport {
  /** Pairs of live bookings of one atom whose windows overlap (must be 0). */
  deviceOverlaps: number;
  /** (node, resource, instant) points where scalar bookings exceed allocatable (must be 0). */
  scalarOverbookings: number;
}

/**
 * Checks, in one query, the guarantee the database referees: no two bookings of an atom overlap,
 * and no scalar resource of a node is booked beyond its allocatable amount at any instant (the
 * peak of a step function is reached at some booking's start, so those are the points checked).
 */
export async function checkBookingInvariants(db: Db): Promise<BookingInvariantReport> {
  const { rows } = await sql<{ device_overlaps: string; scalar_overbookings: string }>`
    SELECT
      (SELECT count(*) FROM device_bookings a
         JOIN device_bookings b ON ${bookingOfDevice('b', sql.ref('a.device_id'))} AND a.allocation_id < b.allocation_id
                                AND a.during && b.during) AS device_overlaps,
      (SELECT count(*) FROM scalar_bookings s
         JOIN host_resources h ON h.node_id = s.node_id AND h.resource = s.resource
         WHERE (SELECT sum(o.amount) FROM scalar_bookings o
                 WHERE ${hostBookingOfNode('o', sql.ref('s.node_id'), sql`lower(s.during)`)} AND o.resource = s.resource
                   AND o.during @> lower(s.during)) > h.allocatable) AS scalar_overbookings`.execute(db);
  return {
    deviceOverlaps: Number(rows[0]!.device_overlaps),
    scalarOverbookings: Number(rows[0]!.scalar_overbookings),
  };
}
