import { sql } from 'kysely';
import type { Db } from '../../core/database.ts';

/**
 * Checks, in one query, that holds and reservations never oversell a host between them: the
 * number of (node, resource, instant) points where reservations' scalar bookings and holds'
 * bookings together exceed allocatable (must be 0). The peak of a step function is reached at
 * some booking's start, so those are the instants checked. Read-only.
 */
export async function countHostOversells(db: Db): Promise<number> {
  const { rows } = await sql<{ oversells: string }>`
    WITH b AS (
      SELECT node_id, resource, amount, during FROM scalar_bookings
      UNION ALL SELECT node_id, resource, amount, during FROM hold_bookings
    )
    SELECT count(*) AS oversells FROM b s
    JOIN host_resources h ON h.node_id = s.node_id AND h.resource = s.resource
    WHERE (SELECT sum(o.amount) FROM b o
            WHERE o.node_id = s.node_id AND o.resource = s.resource AND o.during @> lower(s.during)) > h.allocatable`.execute(
    db,
  );
  return Number(rows[0]!.oversells);
}
