import { type RawBuilder, sql, type Transaction } from 'kysely';
import type { Database, Db } from '../../core/database.ts';
import { isGuardAbort } from '../conflict-retry.ts';
import { preparedMarker } from '../pool.ts';
import {
  type AllocationWithBookings,
  bookingConflictOf,
  bookingOfDevice,
  deviceLockKeys,
  deviceLockSpace,
  hostBookingOfNode,
} from './bookings.ts';
import { nodeAsPlanned } from './node-as-planned.ts';

type Trx = Transaction<Database>;

/** True inside the booking statement when its verdict is to book (for `alsoWhenBooked`'s writes). */
export const bookingGoes = sql<boolean>`((SELECT v FROM verdict) = 'go')`;

/** More writes in the booking's statement, made only when it books (see `alsoWhenBooked`). */
export interface WritesWhenBooked {
  /** CTEs (`name AS (...)`, comma-separated), each writing only `WHERE ${bookingGoes}`. */
  ctes: RawBuilder<unknown>;
  /** What must hold over those CTEs when the statement books; else it fails as 'refused'. */
  holds: RawBuilder<boolean>;
  /** Why it was refused, for the log and the error's message. */
  reason: string;
  /** A value the statement also selects when it books (over those CTEs), handed to `receive`. */
  returned?: { select: RawBuilder<unknown>; receive: (value: unknown) => void };
}

/**
 * A node as a plan saw it from a possibly cached read, for the booking to re-check under its locks:
 * the chosen atoms' class and attributes (by atom id) and the labels the fit needed (null: any value).
 */
export interface NodeVerification {
  deviceClass: string;
  attributes: Record<string, Record<string, unknown>>;
  labels: Record<string, string | null>;
}

/** The highest node id each transaction has locked host rows of (see `waitForHostRows`). */
const highestLockedNode = new WeakMap<object, string>();

/**
 * Tries one placement's booking in one statement (one round trip where it took four): the node's
 * host-resource rows tried FOR UPDATE SKIP LOCKED in resource order, then, only when every one was
 * taken, the per-device locks tried in their fixed order; the room and the devices' bookings
 * checked; and, only when all of that holds, the `planned` allocation inserted with its device
 * bookings (through the EXCLUDE constraint) and its scalar bookings (in resource order, under the
 * guard trigger). Nothing ever waits for a lock, so no two placements wait on each other in a
 * cycle, and placements that chose the same best-fit node spread to their next candidates.
 *
 * The checks read the statement's snapshot, taken just before the locks, so they are a fast
 * answer, not the proof: a booking committed in between is refused by the EXCLUDE constraint or
 * the scalar guard (which reads afresh under the row locks), raised as BookingConflict; the
 * statement having failed, the caller's transaction must end and be retried.
 * 'locked': a concurrent booker holds a host row or a device lock (locks taken so far are held to
 * the end of the transaction); 'stale': a device is booked, the room is gone or a host row is
 * missing; 'booked': inserted, with every lock held to the end of the transaction.
 */
export async function tryInsertAllocationWithBookings(
  trx: Trx | Db,
  input: AllocationWithBookings & {
    /**
     * Wait for the node's host rows first (a statement of its own, so the checks that follow see
     * the winner's booking): only when the node's id is above every node this transaction locked
     * rows of before, so waiters always wait in ascending order and never in a cycle. Answers
     * 'locked' without waiting otherwise.
     */
    waitForHostRows?: boolean;
    /**
     * The node as the placer saw it from a cache: the booking also requires the node to be
     * schedulable now, the atoms to be bookable, healthy and of `deviceClass` with the same
     * attributes, and the labels the fit needed to be there (null: any value); else 'stale'.
     */
    verify?: NodeVerification;
    /**
     * Writes that go with the booking in the same statement (admission's reservation update,
     * events and quota charge): the statement fails whole, answering 'refused', when `holds` is
     * false. Outside a transaction only (the statement is then its own transaction).
     */
    alsoWhenBooked?: WritesWhenBooked;
  },
): Promise<'booked' | 'locked' | 'stale' | 'refused'> {
  const highest = highestLockedNode.get(trx);
  if (input.waitForHostRows && highest !== undefined && input.nodeId <= highest) return 'locked';
  const scalars = Object.entries(input.resources)
    .filter(([, amount]) => (amount ?? 0) > 0)
    .sort(([a], [b]) => a.localeCompare(b));
  const names = scalars.map(([r]) => r);
  const amounts = scalars.map(([, m]) => String(m));
  const start = input.start.toISOString();
  const during = sql`tstzrange(${start}::timestamptz, ${input.end.toISOString()}::timestamptz, '[)')`;
  const booked = input.bookedUntil
    ? sql`tstzrange(${start}::timestamptz, ${input.bookedUntil.toISOString()}::timestamptz, '[)')`
    : during;
  const deviceIds = input.deviceIds as string[];
  const verify = input.verify;
  const also = input.alsoWhenBooked;
  if (input.waitForHostRows && names.length > 0) {
    await sql`${sql.raw(preparedMarker)}
      SELECT 1 FROM host_resources WHERE node_id = ${input.nodeId} AND resource = ANY(${names}::text[])
      ORDER BY resource FOR UPDATE`.execute(trx);
  }
  try {
    const { rows } = await sql<{
      verdict: 'go' | 'locked' | 'stale';
      host_rows: number;
    }>`${sql.raw(preparedMarker)}
      WITH present AS MATERIALIZED (
        SELECT count(*) AS n FROM host_resources WHERE node_id = ${input.nodeId} AND resource = ANY(${names}::text[])
      ), host AS MATERIALIZED (
        SELECT resource FROM host_resources WHERE node_id = ${input.nodeId} AND resource = ANY(${names}::text[])
        ORDER BY resource FOR UPDATE SKIP LOCKED
      ), host_got AS MATERIALIZED (
        SELECT count(*) AS n FROM host
      ), locks AS MATERIALIZED (
        SELECT pg_try_advisory_xact_lock(${deviceLockSpace}, k) AS got FROM ${deviceLockKeys(deviceIds)}
        WHERE (SELECT n FROM host_got) = (SELECT n FROM present)
      ), verdict AS MATERIALIZED (
        SELECT CASE
          WHEN (SELECT n FROM host_got) < (SELECT n FROM present) THEN 'locked'
          WHEN NOT COALESCE((SELECT bool_and(got) FROM locks), true) THEN 'locked'
          WHEN (SELECT n FROM present) < cardinality(${names}::text[]) THEN 'stale'
          WHEN ${verify !== undefined} AND NOT ${nodeAsPlanned({
            nodeId: sql`${input.nodeId}::text`,
            deviceIds: sql`${deviceIds}::text[]`,
            deviceClass: sql`${verify?.deviceClass ?? ''}::text`,
            attributes: sql`${JSON.stringify(verify?.attributes ?? {})}::jsonb`,
            labels: sql`${JSON.stringify(verify?.labels ?? {})}::jsonb`,
          })} THEN 'stale'
          -- Device by device (bookingOfDevice): with an array the EXCLUDE index would scan every
          -- booking overlapping the window, whichever the device.
          WHEN EXISTS (
            SELECT 1 FROM unnest(${deviceIds}::text[]) AS want(id)
            CROSS JOIN LATERAL (SELECT 1 FROM device_bookings b
                                WHERE ${bookingOfDevice('b', sql.ref('want.id'))} AND b.during && ${booked} LIMIT 1) AS hit) THEN 'stale'
          WHEN EXISTS (
            SELECT 1 FROM unnest(${names}::text[], ${amounts}::numeric[]) AS w(r, m)
            JOIN host_resources h ON h.node_id = ${input.nodeId} AND h.resource = w.r
            WHERE h.allocatable < w.m
              + COALESCE((SELECT sum(amount) FROM scalar_bookings s
                           WHERE ${hostBookingOfNode('s', sql`${input.nodeId}`, sql`lower(${booked})`)} AND s.resource = w.r AND s.during && ${booked}), 0)
              + COALESCE((SELECT sum(amount) FROM hold_bookings b
                           WHERE ${hostBookingOfNode('b', sql`${input.nodeId}`, sql`lower(${booked})`)} AND b.resource = w.r AND b.during && ${booked}), 0)) THEN 'stale'
          ELSE 'go' END AS v
      ), alloc AS (
        INSERT INTO allocations (id, reservation_id, node_id, state, during, resources)
        SELECT ${input.allocationId}, ${input.reservationId}, ${input.nodeId}, 'planned', ${during},
               ${JSON.stringify(input.resources)}::jsonb
        WHERE (SELECT v FROM verdict) = 'go'
        RETURNING id
      ), devices AS (
        INSERT INTO device_bookings (device_id, allocation_id, during)
        SELECT d, (SELECT id FROM alloc), ${booked}
        FROM unnest(${deviceIds}::text[]) AS d
        WHERE (SELECT v FROM verdict) = 'go'
        RETURNING 1
      ), scalar AS (
        INSERT INTO scalar_bookings (allocation_id, node_id, resource, amount, during)
        SELECT (SELECT id FROM alloc), ${input.nodeId}, r, m, ${booked}
        FROM unnest(${names}::text[], ${amounts}::numeric[]) WITH ORDINALITY AS t(r, m, i)
        WHERE (SELECT v FROM verdict) = 'go' AND (SELECT count(*) FROM devices) >= 0
        ORDER BY i
        RETURNING 1
      )${also ? sql`, ${also.ctes}` : sql``}
      SELECT (SELECT v FROM verdict) AS verdict, (SELECT n FROM host_got)::int AS host_rows,
             (SELECT count(*) FROM scalar) AS inserted${
               also
                 ? sql`, CASE WHEN ${bookingGoes} AND NOT (${also.holds}) THEN compute_abort(${also.reason}) END AS aborted,
                       ${also.returned?.select ?? sql`NULL`} AS returned`
                 : sql``
             }`.execute(trx);
    const verdict = rows[0]?.verdict;
    if (verdict === 'go') also?.returned?.receive((rows[0] as { returned?: unknown }).returned);
    // Rows of this node are now held (some or all) to the end of the transaction.
    const held = trx.isTransaction && (rows[0]?.host_rows ?? 0) > 0;
    if (held && (highest === undefined || input.nodeId > highest)) {
      highestLockedNode.set(trx, input.nodeId);
    }
    return verdict === 'go' ? 'booked' : verdict === 'locked' ? 'locked' : 'stale';
  } catch (error) {
    if (isGuardAbort(error)) return 'refused';
    throw bookingConflictOf(error, { deviceIds: input.deviceIds, nodeId: input.nodeId });
  }
}
