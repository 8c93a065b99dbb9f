import { sql, type Transaction } from 'kysely';
import type { Database } from '../../core/database.ts';
import type { HostResource } from '../../domain/fleet.ts';
import type { HostResourceAmounts } from '../../domain/reservation-request.ts';
import { preparedMarker } from '../pool.ts';
import { bookingOfDevice, hostBookingOfNode, isBookingRefusal, lockHostRowsAndDevices } from './bookings.ts';
import { nodeAsPlanned } from './node-as-planned.ts';
import { PlacementContention } from './placement.ts';
import type { NodeVerification } from './try-book.ts';

type Trx = Transaction<Database>;

/** One allocation a pool-lease batch planned in memory: a reservation's atoms on one node. */
export interface PlannedAllocation {
  allocationId: string;
  reservationId: string;
  nodeId: string;
  deviceIds: readonly string[];
  /** Scalar host resources booked on the node (amounts of 0 are not booked). */
  resources: Partial<HostResourceAmounts>;
  start: Date;
  end: Date;
  /** The node as the plan saw it (possibly from the placer's node cache), re-checked under the locks. */
  verify: NodeVerification;
}

const range = (s: string, e: string) => sql`tstzrange(${sql.ref(s)}, ${sql.ref(e)}, '[)')`;

/**
 * Books a whole batch of planned allocations in the caller's transaction, in two statements:
 * 1. the locks (lockHostRowsAndDevices): the host-resource rows of every node that books scalar
 *    resources FOR UPDATE in the global order (node, then resource: the guard trigger's), then
 *    every atom's per-device lock in their fixed order;
 * 2. under all of them, with a snapshot taken after they were granted (so it sees whatever the
 *    previous holders committed), one statement re-checks each plan: the room on its node
 *    (counting every booking and every other plan of the batch on the node overlapping its
 *    window), its atoms' bookings, and the node as the plan saw it (nodeAsPlanned: schedulable,
 *    its atoms and the labels needed); and, in the same statement, inserts the plans the re-check
 *    kept: their allocations, their device bookings (through the EXCLUDE constraint) and their
 *    scalar bookings (in node and resource order, under the guard trigger, which checks the
 *    statement's rows together).
 * A plan the re-check refuses (something was booked or changed since its candidates were read) is
 * not booked: its reservation id is answered as stale and the caller places it another way. A
 * refusal by the constraint or the guard, which the locks make unexpected, is PlacementContention:
 * the statement failed, so the transaction is over; retry it whole. Answers the stale ids.
 */
export async function bookPlannedAllocations(
  trx: Trx,
  plans: readonly PlannedAllocation[],
): Promise<Set<string>> {
  const stale = new Set<string>();
  if (plans.length === 0) return stale;
  const scalars = plans
    .flatMap((p) =>
      Object.entries(p.resources)
        .filter(([, amount]) => (amount ?? 0) > 0)
        .map(([resource, amount]) => ({ plan: p, resource: resource as HostResource, amount: amount! })),
    )
    .sort((a, b) => (a.plan.nodeId + a.resource).localeCompare(b.plan.nodeId + b.resource));
  const atoms = plans.flatMap((p) => p.deviceIds.map((deviceId) => ({ plan: p, deviceId })));
  await lockHostRowsAndDevices(
    trx,
    {
      nodeIds: [...new Set(scalars.map((s) => s.plan.nodeId))],
      resources: [...new Set(scalars.map((s) => s.resource))],
    },
    atoms.map((a) => a.deviceId),
  );
  try {
    const { rows } = await sql<{ rid: string }>`${sql.raw(preparedMarker)}
      WITH p AS (
        SELECT * FROM unnest(${scalars.map((s) => s.plan.reservationId)}::text[], ${scalars.map((s) => s.plan.allocationId)}::text[],
                             ${scalars.map((s) => s.plan.nodeId)}::text[], ${scalars.map((s) => s.resource)}::text[],
                             ${scalars.map((s) => String(s.amount))}::numeric[],
                             ${scalars.map((s) => s.plan.start.toISOString())}::timestamptz[],
                             ${scalars.map((s) => s.plan.end.toISOString())}::timestamptz[]) WITH ORDINALITY AS p(rid, aid, n, r, m, s, e, i)
      ), t AS (
        SELECT * FROM unnest(${atoms.map((a) => a.deviceId)}::text[], ${atoms.map((a) => a.plan.reservationId)}::text[],
                             ${atoms.map((a) => a.plan.allocationId)}::text[],
                             ${atoms.map((a) => a.plan.start.toISOString())}::timestamptz[],
                             ${atoms.map((a) => a.plan.end.toISOString())}::timestamptz[]) AS t(d, rid, aid, s, e)
      ), v AS (
        SELECT * FROM unnest(${plans.map((p) => p.reservationId)}::text[], ${plans.map((p) => p.allocationId)}::text[],
                             ${plans.map((p) => p.nodeId)}::text[],
                             ${plans.map((p) => p.start.toISOString())}::timestamptz[],
                             ${plans.map((p) => p.end.toISOString())}::timestamptz[],
                             ${plans.map((p) => JSON.stringify(p.resources))}::jsonb[],
                             ${plans.map((p) => JSON.stringify(p.deviceIds))}::jsonb[],
                             ${plans.map((p) => p.verify.deviceClass)}::text[],
                             ${plans.map((p) => JSON.stringify(p.verify.attributes))}::jsonb[],
                             ${plans.map((p) => JSON.stringify(p.verify.labels))}::jsonb[]) AS v(rid, aid, n, s, e, res, ids, c, a, l)
      ), stale AS MATERIALIZED (
        -- Each lookup a correlated subquery, so each is an index probe: joined as sets, they were
        -- planned as scans of every host row and every device booking. A missing host row: -1.
        SELECT p.rid FROM p
        WHERE COALESCE((SELECT h.allocatable FROM host_resources h WHERE h.node_id = p.n AND h.resource = p.r), -1) <
            (SELECT sum(q.m) FROM p q WHERE q.n = p.n AND q.r = p.r AND ${range('q.s', 'q.e')} && ${range('p.s', 'p.e')})
          + COALESCE((SELECT sum(amount) FROM scalar_bookings b
                       WHERE ${hostBookingOfNode('b', sql.ref('p.n'), sql.ref('p.s'))} AND b.resource = p.r AND b.during && ${range('p.s', 'p.e')}), 0)
          + COALESCE((SELECT sum(amount) FROM hold_bookings b
                       WHERE ${hostBookingOfNode('b', sql.ref('p.n'), sql.ref('p.s'))} AND b.resource = p.r AND b.during && ${range('p.s', 'p.e')}), 0)
        UNION
        SELECT t.rid FROM t
        CROSS JOIN LATERAL (SELECT 1 FROM device_bookings b
                            WHERE ${bookingOfDevice('b', sql.ref('t.d'))} AND b.during && ${range('t.s', 't.e')} LIMIT 1) AS hit
        UNION
        SELECT v.rid FROM v
        WHERE NOT ${nodeAsPlanned({
          nodeId: sql.ref('v.n'),
          deviceIds: sql`ARRAY(SELECT jsonb_array_elements_text(v.ids))`,
          deviceClass: sql.ref('v.c'),
          attributes: sql.ref('v.a'),
          labels: sql.ref('v.l'),
        })}
      ), alloc AS (
        INSERT INTO allocations (id, reservation_id, node_id, state, during, resources)
        SELECT v.aid, v.rid, v.n, 'planned', ${range('v.s', 'v.e')}, v.res FROM v
        WHERE v.rid NOT IN (SELECT rid FROM stale)
        RETURNING 1
      ), devices AS (
        INSERT INTO device_bookings (device_id, allocation_id, during)
        SELECT t.d, t.aid, ${range('t.s', 't.e')} FROM t
        WHERE t.rid NOT IN (SELECT rid FROM stale) AND (SELECT count(*) FROM alloc) >= 0
        RETURNING 1
      ), host AS (
        INSERT INTO scalar_bookings (allocation_id, node_id, resource, amount, during)
        SELECT p.aid, p.n, p.r, p.m, ${range('p.s', 'p.e')} FROM p
        WHERE p.rid NOT IN (SELECT rid FROM stale) AND (SELECT count(*) FROM devices) >= 0
        ORDER BY p.i
        RETURNING 1
      )
      SELECT rid FROM stale WHERE (SELECT count(*) FROM host) >= 0`.execute(trx);
    for (const r of rows) stale.add(r.rid);
  } catch (error) {
    // Locked and re-checked, so not expected; the statement failed, so the transaction is over.
    if (isBookingRefusal(error)) throw new PlacementContention('a batch booking was refused under its locks');
    throw error;
  }
  return stale;
}
