import { sql, type Transaction } from 'kysely';
import type { Database } from '../../core/database.ts';
import { BookingConflict, bookingOfDevice, lockDevices } from './bookings.ts';

type Trx = Transaction<Database>;

/**
 * Moves the end of every current allocation of a reservation (its device and scalar bookings that
 * end at `currentEnd`, and the allocation rows) to `newEnd`, all or nothing, in the caller's
 * transaction. The atoms are locked first; when another booking starts before `newEnd` nothing
 * changes and the answer carries `availableUntil`, the latest end every atom can reach. The
 * EXCLUDE constraint and the scalar guard decide (a conflict rolls back to a savepoint). The
 * reservation row itself is the caller's to move. Bookings that outlast the allocations by a fixed
 * span (a leased machine's wipe after its end) keep that span past the new end.
 */
export async function moveAllocationEnds(
  trx: Trx,
  input: { reservationId: string; currentEnd: number; newEnd: number },
): Promise<{ moved: true } | { moved: false; availableUntil: number }> {
  const allocations = await trx
    .selectFrom('allocations')
    .select('id')
    .where('reservation_id', '=', input.reservationId)
    // The current placement: a bound allocation whose node reported it released (BindingLost)
    // is still current and keeps its bookings; only the control plane supersedes one.
    .where('superseded_at', 'is', null)
    .execute();
  const allocationIds = allocations.map((a) => a.id);
  const devices = allocationIds.length
    ? await trx
        .selectFrom('device_bookings')
        .select('device_id')
        .where('allocation_id', 'in', allocationIds)
        .execute()
    : [];
  const deviceIds = devices.map((d) => d.device_id);
  await lockDevices(trx, deviceIds);
  const tailMs = await bookedPastEndMs(trx, allocationIds, input.currentEnd);
  const current = new Date(input.currentEnd + tailMs).toISOString();
  const target = new Date(input.newEnd + tailMs).toISOString();
  const { rows } = await sql<{ next: Date | null }>`
    SELECT min(lower(b.during)) AS next FROM unnest(${deviceIds}::text[]) AS id
    JOIN device_bookings b ON ${bookingOfDevice('b', sql.ref('id'))}
    WHERE NOT (b.allocation_id = ANY(${allocationIds}::text[]))
      AND b.during && tstzrange(${current}::timestamptz, ${target}::timestamptz, '[)')`.execute(trx);
  const next = rows[0]?.next?.getTime();
  if (next !== undefined) return { moved: false, availableUntil: Math.max(next - tailMs, input.currentEnd) };
  await sql`SAVEPOINT extend_bookings`.execute(trx);
  try {
    for (const table of [sql.raw('device_bookings'), sql.raw('scalar_bookings')]) {
      await sql`UPDATE ${table} SET during = tstzrange(lower(during), ${target}::timestamptz, '[)')
        WHERE allocation_id = ANY(${allocationIds}::text[]) AND upper(during) = ${current}::timestamptz`.execute(
        trx,
      );
    }
    await sql`RELEASE SAVEPOINT extend_bookings`.execute(trx);
  } catch (error) {
    const code = (error as { code?: string }).code;
    if (error instanceof BookingConflict || code === 'BC001' || code === '23P01') {
      await sql`ROLLBACK TO SAVEPOINT extend_bookings`.execute(trx);
      return { moved: false, availableUntil: input.currentEnd };
    }
    throw error;
  }
  const allocationEnd = new Date(input.currentEnd).toISOString();
  const newAllocationEnd = new Date(input.newEnd).toISOString();
  await sql`UPDATE allocations SET during = tstzrange(lower(during), ${newAllocationEnd}::timestamptz, '[)'), updated_at = compute_now()
    WHERE id = ANY(${allocationIds}::text[]) AND upper(during) = ${allocationEnd}::timestamptz`.execute(trx);
  return { moved: true };
}

/** How far the allocations' bookings run past `endMs` (0 for bookings that end with them). */
async function bookedPastEndMs(trx: Trx, allocationIds: readonly string[], endMs: number): Promise<number> {
  if (allocationIds.length === 0) return 0;
  const { rows } = await sql<{ until: Date | null }>`
    SELECT greatest(
      (SELECT max(upper(during)) FROM device_bookings WHERE allocation_id = ANY(${allocationIds}::text[])),
      (SELECT max(upper(during)) FROM scalar_bookings WHERE allocation_id = ANY(${allocationIds}::text[]))) AS until`.execute(
    trx,
  );
  const until = rows[0]?.until?.getTime();
  return until !== undefined && until > endMs ? until - endMs : 0;
}
