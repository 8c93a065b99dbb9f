import { type RawBuilder, sql, type Transaction } from 'kysely';
import type { Database } from '../../core/database.ts';
import { ComputeError } from '../../domain/errors.ts';
import type { HostResource } from '../../domain/fleet.ts';
import { preparedMarker } from '../pool.ts';

type Trx = Transaction<Database>;

/** Advisory-lock namespace for per-device booking locks (the first key of the two-key form). */
export const deviceLockSpace = 0x6263_0001;

export interface TimeWindow {
  start: Date;
  end: Date;
}

/** One device booked for one allocation over a window. */
export interface DeviceBooking extends TimeWindow {
  deviceId: string;
  allocationId: string;
}

/** One scalar host resource booked for one allocation on its node. */
export interface ScalarBooking extends TimeWindow {
  allocationId: string;
  nodeId: string;
  resource: HostResource;
  amount: number;
}

/** Thrown when the database refuses a booking: the atom or the scalar amount is already taken. */
export class BookingConflict extends ComputeError {
  constructor(message: string, details?: Record<string, unknown>) {
    super('CAPACITY_UNAVAILABLE', message, details);
  }
}

/**
 * The per-device lock keys of `deviceIds`, one row each (`k`), in the one fixed order every
 * booking writer takes them in. Every statement that locks devices selects from this.
 */
export function deviceLockKeys(deviceIds: readonly string[]) {
  return sql`(SELECT DISTINCT hashtext(id) AS k FROM unnest(${deviceIds as string[]}::text[]) AS id ORDER BY k) AS keys`;
}

/**
 * A condition that holds once the per-device locks of `deviceIds` are all taken, in their fixed
 * order: an uncorrelated scalar subquery, so PostgreSQL evaluates it once (an InitPlan under a
 * one-time filter) before the statement produces its first row, i.e. before any booking goes in.
 * An aggregate over the ordered keys instead of a CTE scanned by one: the same locks in the same
 * order, with less executor work per statement.
 */
function deviceLocksTaken(deviceIds: readonly string[]) {
  return sql`(SELECT count(pg_advisory_xact_lock(${deviceLockSpace}, k)) FROM ${deviceLockKeys(deviceIds)}) >= 0`;
}

/**
 * The condition that the device_bookings row `alias` books the device `deviceId` (an SQL
 * expression), in the form the exclusion index answers: its first column is
 * `hashtext(device_id)` (migrations/2026-12-01T00-device-booking-guard.ts), so a lookup by the
 * device id alone would scan the whole index. Every lookup of a device's bookings uses this.
 */
export function bookingOfDevice(alias: string, deviceId: RawBuilder<unknown>): RawBuilder<unknown> {
  const column = sql.ref(`${alias}.device_id`);
  return sql`(hashtext(${column}) = hashtext(${deviceId}) AND ${column} = ${deviceId})`;
}

/**
 * The condition that the scalar_bookings or hold_bookings row `alias` is a booking of the node
 * `nodeId` still running at `from` or later (both SQL expressions; `from` a timestamptz), in the
 * form their btree indexes answer: `(node_id, resource, coalesce(upper(during), 'infinity'))`
 * (migrations/2026-12-03T00-host-booking-end-index.ts). Bookings are kept after they end, so a
 * lookup without the end bound would read every booking the node ever had. The caller adds its
 * resource and its exact time test (`during && …`, `during @> …`); every lookup of a node's host
 * bookings uses this.
 */
export function hostBookingOfNode(
  alias: string,
  nodeId: RawBuilder<unknown>,
  from: RawBuilder<unknown>,
): RawBuilder<unknown> {
  const during = sql.ref(`${alias}.during`);
  return sql`(${sql.ref(`${alias}.node_id`)} = ${nodeId} AND coalesce(upper(${during}), 'infinity'::timestamptz) >= ${from})`;
}

/**
 * Whether a statement that wrote device and scalar bookings was refused by the database's guards:
 * the EXCLUDE constraint (23P01), the scalar guard (BC001) or a missing resource row (23503).
 */
export function isBookingRefusal(error: unknown): boolean {
  return isPgError(error, '23P01') || isPgError(error, 'BC001') || isPgError(error, '23503');
}

/**
 * An exclusion refusal (23P01) as BookingConflict and, for writers of a node's scalar resources
 * (`nodeId` given), a guard refusal (BC001, or 23503 for a missing resource row); anything else as is.
 */
export function bookingConflictOf(
  error: unknown,
  what: { deviceIds?: readonly string[]; nodeId?: string; resource?: string; message?: string },
) {
  if (isPgError(error, '23P01')) {
    return new BookingConflict('a device is already booked for an overlapping window', {
      deviceIds: what.deviceIds,
    });
  }
  if (what.nodeId && (isPgError(error, 'BC001') || isPgError(error, '23503'))) {
    return new BookingConflict(what.message ?? `node ${what.nodeId} cannot give the host resources asked`, {
      nodeId: what.nodeId,
      ...(what.resource ? { resource: what.resource } : {}),
    });
  }
  return error;
}

/**
 * Takes the per-device transaction locks for `deviceIds` in one fixed order (the traffic light of
 * DESIGN.md principle 1), so concurrent writers of the same atoms queue instead of deadlocking on
 * the EXCLUDE constraint. A caller that already holds device locks must not wait for more (that
 * would break the order): it uses tryLockFreeDevices instead.
 */
export async function lockDevices(trx: Trx, deviceIds: readonly string[]): Promise<void> {
  if (deviceIds.length === 0) return;
  await sql`SELECT pg_advisory_xact_lock(${deviceLockSpace}, k) FROM ${deviceLockKeys(deviceIds)}`.execute(
    trx,
  );
}

/**
 * lockDevices after the host-resource rows `resources` of the nodes `nodeIds` (every pair), in
 * one statement and in the global order: the host rows FOR UPDATE by node, then resource (the
 * guard trigger's order) in an uncorrelated subquery of the one-time filter, which PostgreSQL
 * evaluates before the first lock key is read, even when there is none; then the per-device locks
 * in their fixed order. For a writer that books on many nodes at once and holds no lock yet.
 */
export async function lockHostRowsAndDevices(
  trx: Trx,
  host: { nodeIds: readonly string[]; resources: readonly string[] },
  deviceIds: readonly string[],
): Promise<void> {
  if (host.nodeIds.length === 0 || host.resources.length === 0) return lockDevices(trx, deviceIds);
  await sql`${sql.raw(preparedMarker)}
    SELECT count(pg_advisory_xact_lock(${deviceLockSpace}, k)) FROM ${deviceLockKeys(deviceIds)}
    WHERE (SELECT count(*) FROM (
             SELECT 1 FROM host_resources
             WHERE node_id = ANY(${host.nodeIds as string[]}::text[]) AND resource = ANY(${host.resources as string[]}::text[])
             ORDER BY node_id COLLATE "C", resource COLLATE "C" FOR UPDATE) AS host_rows) >= 0`.execute(trx);
}

function isPgError(error: unknown, code: string): error is { code: string; message: string } {
  return typeof error === 'object' && error !== null && (error as { code?: unknown }).code === code;
}

/**
 * Inserts device bookings after taking their locks in order. The EXCLUDE constraint is the proof:
 * an overlap raises BookingConflict and, since the statement failed, the transaction must end.
 */
export async function insertDeviceBookings(trx: Trx, bookings: readonly DeviceBooking[]): Promise<void> {
  if (bookings.length === 0) return;
  const deviceIds = bookings.map((b) => b.deviceId);
  try {
    const [only] = bookings;
    if (bookings.length === 1 && only) {
      // One device: its one lock (a FROM-less SELECT filters once, before its row is inserted)
      // and scalar parameters, without the arrays, their unnest and the keys' sort.
      await sql`${sql.raw(preparedMarker)}
        INSERT INTO device_bookings (device_id, allocation_id, during)
        SELECT ${only.deviceId}::text, ${only.allocationId}::text,
               tstzrange(${only.start.toISOString()}::timestamptz, ${only.end.toISOString()}::timestamptz, '[)')
        WHERE pg_advisory_xact_lock(${deviceLockSpace}, hashtext(${only.deviceId}::text)) IS NOT NULL`.execute(
        trx,
      );
      return;
    }
    // One round trip: the locks are taken first (an InitPlan of the WHERE clause), in key order.
    await sql`${sql.raw(preparedMarker)}
      INSERT INTO device_bookings (device_id, allocation_id, during)
      SELECT d, a, tstzrange(s, e, '[)')
      FROM unnest(${deviceIds}::text[], ${bookings.map((b) => b.allocationId)}::text[],
                  ${bookings.map((b) => b.start.toISOString())}::timestamptz[],
                  ${bookings.map((b) => b.end.toISOString())}::timestamptz[]) AS t(d, a, s, e)
      WHERE ${deviceLocksTaken(deviceIds)}`.execute(trx);
  } catch (error) {
    throw bookingConflictOf(error, { deviceIds });
  }
}

/**
 * Inserts scalar bookings in (node, resource) order, in one statement: the guard trigger locks the
 * statement's resource rows and refuses it, with BookingConflict, when a node's sum over any of its
 * rows' windows (the statement's rows all counted) goes beyond allocatable.
 */
export async function insertScalarBookings(trx: Trx, bookings: readonly ScalarBooking[]): Promise<void> {
  const ordered = [...bookings]
    .filter((b) => b.amount > 0)
    .sort((a, b) => (a.nodeId + a.resource).localeCompare(b.nodeId + b.resource));
  if (ordered.length === 0) return;
  try {
    await sql`${sql.raw(preparedMarker)}
      INSERT INTO scalar_bookings (allocation_id, node_id, resource, amount, during)
      SELECT a, n, r, m, tstzrange(s, e, '[)')
      FROM unnest(${ordered.map((b) => b.allocationId)}::text[], ${ordered.map((b) => b.nodeId)}::text[],
                  ${ordered.map((b) => b.resource)}::text[], ${ordered.map((b) => String(b.amount))}::numeric[],
                  ${ordered.map((b) => b.start.toISOString())}::timestamptz[],
                  ${ordered.map((b) => b.end.toISOString())}::timestamptz[]) WITH ORDINALITY AS t(a, n, r, m, s, e, i)
      ORDER BY i`.execute(trx);
  } catch (error) {
    const message = isPgError(error, 'BC001') || isPgError(error, '23503') ? error.message : '';
    const refused =
      ordered.find((b) => message.includes(` ${b.resource} of node ${b.nodeId} `)) ?? ordered[0]!;
    throw bookingConflictOf(error, {
      nodeId: refused.nodeId,
      resource: refused.resource,
      message: `node ${refused.nodeId} cannot give ${refused.amount} ${refused.resource}`,
    });
  }
}

/** A new allocation on one node with its device and scalar bookings over one window. */
export interface AllocationWithBookings extends TimeWindow {
  allocationId: string;
  reservationId: string;
  nodeId: string;
  deviceIds: readonly string[];
  /** Scalar host resources booked on the node (amounts of 0 are not booked). */
  resources: Partial<Record<HostResource, number>>;
  /** The bookings' end when they outlast the allocation's own `end` (a leased machine's wipe). */
  bookedUntil?: Date | undefined;
}

/**
 * Ends an allocation's bookings at compute_now(): a current booking is truncated, future ones are
 * deleted. Idempotent: a second call finds nothing left to change.
 */
export async function truncateAllocationBookings(trx: Trx, allocationId: string): Promise<void> {
  for (const table of [sql.raw('device_bookings'), sql.raw('scalar_bookings')]) {
    await sql`DELETE FROM ${table} WHERE allocation_id = ${allocationId} AND lower(during) >= compute_now()`.execute(
      trx,
    );
    await sql`
      UPDATE ${table} SET during = tstzrange(lower(during), compute_now(), '[)')
      WHERE allocation_id = ${allocationId} AND upper(during) > compute_now()`.execute(trx);
  }
}
