import { sql, type Transaction } from 'kysely';
import type { Database } from '../../core/database.ts';
import type { HostResource } from '../../domain/fleet.ts';
import type { HostResourceAmounts } from '../../domain/reservation-request.ts';
import { preparedMarker } from '../pool.ts';
import {
  BookingConflict,
  bookingOfDevice,
  hostBookingOfNode,
  insertDeviceBookings,
  insertScalarBookings,
  lockDevices,
} from './bookings.ts';
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
 * Books a whole batch of planned allocations in the caller's transaction, set-based: the host-resource
 * rows of every node that books scalar resources locked FOR UPDATE in one statement in the global
 * order (node, then resource: lockHostRoom's and the guard trigger's); then every atom's
 * per-device lock taken in one statement in their fixed order (lockDevices); then, under all of
 * them, one statement re-checks each plan: the room on its node (counting every booking and every
 * other plan of the batch on the node overlapping its window), its atoms' bookings, and the node
 * as the plan saw it (nodeAsPlanned: schedulable, its atoms and the labels needed).
 * A plan the re-checks refuse (something was booked or changed since its candidates were read) is not
 * booked: its reservation id is answered as stale and the caller places it another way. The rest
 * are inserted with one statement per table: allocations, device bookings (through the EXCLUDE
 * constraint, insertDeviceBookings) and scalar bookings (under their guard trigger,
 * insertScalarBookings). A refusal there, which the locks make unexpected, is PlacementContention:
 * the transaction is over, retry it whole. Answers the stale reservation ids.
 */
export async function bookPlannedAllocations(
  trx: Trx,
  plans: readonly PlannedAllocation[],
): Promise<Set<string>> {
  const stale = new Set<string>();
  if (plans.length === 0) return stale;
  const scalars = plans.flatMap((p) =>
    Object.entries(p.resources)
      .filter(([, amount]) => (amount ?? 0) > 0)
      .map(([resource, amount]) => ({ plan: p, resource: resource as HostResource, amount: amount! })),
  );
  if (scalars.length > 0) {
    const nodeIds = [...new Set(scalars.map((s) => s.plan.nodeId))];
    const names = [...new Set(scalars.map((s) => s.resource))];
    await sql`${sql.raw(preparedMarker)}
      SELECT 1 FROM host_resources WHERE node_id = ANY(${nodeIds}::text[]) AND resource = ANY(${names}::text[])
      ORDER BY node_id COLLATE "C", resource COLLATE "C" FOR UPDATE`.execute(trx);
  }
  const atoms = plans.flatMap((p) => p.deviceIds.map((deviceId) => ({ plan: p, deviceId })));
  await lockDevices(
    trx,
    atoms.map((a) => a.deviceId),
  );
  const { rows: changed } = await sql<{ rid: string }>`${sql.raw(preparedMarker)}
    WITH p AS (
      SELECT * FROM unnest(${scalars.map((s) => s.plan.reservationId)}::text[], ${scalars.map((s) => s.plan.nodeId)}::text[],
                           ${scalars.map((s) => s.resource)}::text[], ${scalars.map((s) => String(s.amount))}::numeric[],
                           ${scalars.map((s) => s.plan.start.toISOString())}::timestamptz[],
                           ${scalars.map((s) => s.plan.end.toISOString())}::timestamptz[]) AS p(rid, n, r, m, s, e)
    )
    SELECT p.rid FROM p
    LEFT JOIN host_resources h ON h.node_id = p.n AND h.resource = p.r
    WHERE h.node_id IS NULL OR h.allocatable <
        (SELECT sum(q.m) FROM p q WHERE q.n = p.n AND q.r = p.r AND ${range('q.s', 'q.e')} && ${range('p.s', 'p.e')})
      + COALESCE((SELECT sum(amount) FROM scalar_bookings b
                   WHERE ${hostBookingOfNode('b', sql.ref('p.n'), sql.ref('p.s'))} AND b.resource = p.r AND b.during && ${range('p.s', 'p.e')}), 0)
      + COALESCE((SELECT sum(amount) FROM hold_bookings b
                   WHERE ${hostBookingOfNode('b', sql.ref('p.n'), sql.ref('p.s'))} AND b.resource = p.r AND b.during && ${range('p.s', 'p.e')}), 0)
    UNION
    SELECT t.rid
    FROM unnest(${atoms.map((a) => a.deviceId)}::text[], ${atoms.map((a) => a.plan.reservationId)}::text[],
                ${atoms.map((a) => a.plan.start.toISOString())}::timestamptz[],
                ${atoms.map((a) => a.plan.end.toISOString())}::timestamptz[]) AS t(d, rid, s, e)
    JOIN device_bookings b ON ${bookingOfDevice('b', sql.ref('t.d'))} AND b.during && ${range('t.s', 't.e')}
    UNION
    SELECT v.rid
    FROM unnest(${plans.map((p) => p.reservationId)}::text[], ${plans.map((p) => p.nodeId)}::text[],
                ${plans.map((p) => JSON.stringify(p.deviceIds))}::jsonb[],
                ${plans.map((p) => p.verify.deviceClass)}::text[],
                ${plans.map((p) => JSON.stringify(p.verify.attributes))}::jsonb[],
                ${plans.map((p) => JSON.stringify(p.verify.labels))}::jsonb[]) AS v(rid, n, ids, c, a, l)
    WHERE NOT ${nodeAsPlanned({
      nodeId: sql.ref('v.n'),
      deviceIds: sql`ARRAY(SELECT jsonb_array_elements_text(v.ids))`,
      deviceClass: sql.ref('v.c'),
      attributes: sql.ref('v.a'),
      labels: sql.ref('v.l'),
    })}`.execute(trx);
  for (const r of changed) stale.add(r.rid);

  const kept = plans.filter((p) => !stale.has(p.reservationId));
  if (kept.length === 0) return stale;
  await sql`${sql.raw(preparedMarker)}
    INSERT INTO allocations (id, reservation_id, node_id, state, during, resources)
    SELECT id, rid, n, 'planned', tstzrange(s, e, '[)'), r
    FROM unnest(${kept.map((p) => p.allocationId)}::text[], ${kept.map((p) => p.reservationId)}::text[],
                ${kept.map((p) => p.nodeId)}::text[], ${kept.map((p) => p.start.toISOString())}::timestamptz[],
                ${kept.map((p) => p.end.toISOString())}::timestamptz[],
                ${kept.map((p) => JSON.stringify(p.resources))}::jsonb[]) AS t(id, rid, n, s, e, r)`.execute(
    trx,
  );
  try {
    await insertDeviceBookings(
      trx,
      kept.flatMap((p) =>
        p.deviceIds.map((deviceId) => ({
          deviceId,
          allocationId: p.allocationId,
          start: p.start,
          end: p.end,
        })),
      ),
    );
    await insertScalarBookings(
      trx,
      kept.flatMap((p) =>
        Object.entries(p.resources).map(([resource, amount]) => ({
          allocationId: p.allocationId,
          nodeId: p.nodeId,
          resource: resource as HostResource,
          amount: amount ?? 0,
          start: p.start,
          end: p.end,
        })),
      ),
    );
  } catch (error) {
    // Locked and re-checked, so not expected; the statement failed, so the transaction is over.
    if (error instanceof BookingConflict)
      throw new PlacementContention('a batch booking was refused under its locks');
    throw error;
  }
  return stale;
}
