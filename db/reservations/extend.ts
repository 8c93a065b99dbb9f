import { sql, type Transaction } from 'kysely';
import type { Database, Db } from '../../core/database.ts';
import { ComputeError } from '../../domain/errors.ts';
import { newId } from '../../domain/ids.ts';
import { maxDurationMs } from '../../domain/reservation-schema.ts';
import { holdingStates, isExtendable } from '../../domain/reservation-states.ts';
import { BookingConflict, lockDevices } from '../allocations/bookings.ts';
import { insertAuditEvent } from '../events/audit.ts';
import { insertOutboxEvent } from '../events/outbox.ts';
import { readAuthzResource, setAuthzPending } from '../iam/authz.ts';
import { type CallerAudit, lockReservation } from './reservations.ts';

type Trx = Transaction<Database>;

/** How long an extend's hold on the slot lasts before another extend may take it over. */
export const extendHoldSeconds = 60;

/**
 * Takes the one extend slot of a reservation for a fresh hold (a nonce), or answers null while
 * another extend younger than 60 s holds it; stages the pending change in the authz row.
 */
export async function stageExtend(
  trx: Trx,
  reservationId: string,
  pending: Record<string, unknown>,
): Promise<string | null> {
  const hold = newId('hold');
  const taken = await sql<{ hold: string }>`
    INSERT INTO extend_holds (reservation_id, hold) VALUES (${reservationId}, ${hold})
    ON CONFLICT (reservation_id) DO UPDATE SET hold = EXCLUDED.hold, taken_at = compute_now()
      WHERE extend_holds.taken_at < compute_now() - make_interval(secs => ${extendHoldSeconds})
    RETURNING hold`.execute(trx);
  if (taken.rows[0]?.hold !== hold) return null;
  await setAuthzPending(trx, 'compute-reservation', reservationId, pending);
  return hold;
}

/** Clears the pending change and the slot, only when `hold` still owns it (a refusal or an abandon). */
export async function abandonExtend(db: Db, reservationId: string, hold: string): Promise<void> {
  await db.transaction().execute(async (trx) => {
    const mine = await sql<{ hold: string }>`
      DELETE FROM extend_holds WHERE reservation_id = ${reservationId} AND hold = ${hold} RETURNING hold`.execute(
      trx,
    );
    if (mine.rows.length > 0) await setAuthzPending(trx, 'compute-reservation', reservationId, null);
  });
}

export type ExtendOutcome =
  | { extended: true; end: number }
  | { extended: false; availableUntil: number; reason: 'booked' | 'hold-lost' };

/**
 * Moves every current allocation's end (devices and host resources) to `newEnd`, all or nothing,
 * in the caller's transaction, only while `hold` owns the slot. The atoms are locked first; when
 * another booking starts before `newEnd` nothing changes and the answer carries `availableUntil`,
 * the latest end every atom can reach. The EXCLUDE constraint and the scalar guard decide.
 */
export async function applyExtend(
  trx: Trx,
  input: {
    reservationId: string;
    hold: string;
    currentEnd: number;
    newEnd: number;
    attributes: Record<string, unknown>;
  },
): Promise<ExtendOutcome> {
  const owns =
    await sql`SELECT 1 FROM extend_holds WHERE reservation_id = ${input.reservationId} AND hold = ${input.hold}`.execute(
      trx,
    );
  if (owns.rows.length === 0)
    return { extended: false, availableUntil: input.currentEnd, reason: 'hold-lost' };
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
  const current = new Date(input.currentEnd).toISOString();
  const target = new Date(input.newEnd).toISOString();
  const { rows } = await sql<{ next: Date | null }>`
    SELECT min(lower(during)) AS next FROM device_bookings
    WHERE device_id = ANY(${deviceIds}::text[]) AND NOT (allocation_id = ANY(${allocationIds}::text[]))
      AND during && tstzrange(${current}::timestamptz, ${target}::timestamptz, '[)')`.execute(trx);
  const next = rows[0]?.next?.getTime();
  if (next !== undefined)
    return { extended: false, availableUntil: Math.max(next, input.currentEnd), reason: 'booked' };
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
      return { extended: false, availableUntil: input.currentEnd, reason: 'booked' };
    }
    throw error;
  }
  await sql`UPDATE allocations SET during = tstzrange(lower(during), ${target}::timestamptz, '[)'), updated_at = compute_now()
    WHERE id = ANY(${allocationIds}::text[]) AND upper(during) = ${current}::timestamptz`.execute(trx);
  const row = await trx
    .updateTable('reservations')
    .set({
      during: sql<string>`tstzrange(lower(during), ${target}::timestamptz, '[)')`,
      duration_ms: sql<string>`(extract(epoch FROM (${target}::timestamptz - lower(during))) * 1000)::bigint`,
      version: sql<number>`version + 1`,
      updated_at: sql<Date>`compute_now()`,
    })
    .where('id', '=', input.reservationId)
    .returning(['tenant_id', 'pool_id'])
    .executeTakeFirstOrThrow();
  await trx
    .updateTable('authz_projection')
    .set({
      attributes: JSON.stringify(input.attributes),
      pending: null,
      updated_at: sql<Date>`compute_now()`,
    })
    .where('resource_type', '=', 'compute-reservation')
    .where('resource_id', '=', input.reservationId)
    .execute();
  await sql`DELETE FROM extend_holds WHERE reservation_id = ${input.reservationId}`.execute(trx);
  await insertOutboxEvent(trx, {
    type: 'reservation.extended',
    subject: `reservation/${input.reservationId}`,
    tenantId: row.tenant_id,
    data: {
      reservationId: input.reservationId,
      poolId: row.pool_id,
      end: input.newEnd,
      previousEnd: input.currentEnd,
    },
  });
  return { extended: true, end: input.newEnd };
}

/** The reservation's booked window in epoch ms; null when it has none. */
async function readWindow(trx: Trx, reservationId: string): Promise<{ start: number; end: number } | null> {
  const { rows } = await sql<{ s: Date | null; e: Date | null }>`
    SELECT lower(during) AS s, upper(during) AS e FROM reservations WHERE id = ${reservationId}`.execute(trx);
  const row = rows[0];
  return row?.s && row.e ? { start: row.s.getTime(), end: row.e.getTime() } : null;
}

export type StagedExtend =
  | { noop: true; window: { start: number; end: number } }
  | {
      noop: false;
      window: { start: number; end: number };
      newEnd: number;
      hold: string;
      attributes: Record<string, unknown>;
    };

/**
 * An extend's first transaction, in the caller's transaction: the reservation locked, its new end
 * (`until`, or its end moved `byMs` later) checked, and, when it moves the end later, the extend
 * slot taken with the pending change (the new `durationHours`) staged in the authz row for the IAM
 * decision to read. An end no later than the current one is a no-op. INVALID_STATE outside
 * placed/binding/active or without a booked window; INVALID_INPUT (naming `until` or `by`) past
 * 90 days in all; CONFLICT while another extend holds the slot.
 */
export async function stageExtendWindow(
  trx: Trx,
  input: { reservationId: string; until?: number | undefined; byMs?: number | undefined },
): Promise<StagedExtend> {
  const { reservationId } = input;
  const locked = (await lockReservation(trx, reservationId))!;
  if (!isExtendable(locked.state)) {
    throw new ComputeError(
      'INVALID_STATE',
      `reservation ${reservationId} is ${locked.state}: only placed, binding or active reservations extend`,
      { state: locked.state },
    );
  }
  const window = await readWindow(trx, reservationId);
  if (!window)
    throw new ComputeError('INVALID_STATE', `reservation ${reservationId} has no booked window to extend`);
  const newEnd = input.until ?? window.end + input.byMs!;
  if (newEnd <= window.end) return { noop: true, window };
  if (newEnd - window.start > maxDurationMs) {
    throw new ComputeError(
      'INVALID_INPUT',
      `${input.until ? 'until' : 'by'}: a reservation lasts at most 90d`,
    );
  }
  const current = (await readAuthzResource(trx, 'compute-reservation', reservationId))?.attributes ?? {};
  const attributes = {
    ...current,
    durationHours: Math.round(((newEnd - window.start) / 3_600_000) * 1000) / 1000,
  };
  const hold = await stageExtend(trx, reservationId, { durationHours: attributes.durationHours });
  if (!hold) {
    throw new ComputeError(
      'CONFLICT',
      `another extend of reservation ${reservationId} is in flight; retry in a minute`,
      {
        reason: 'extend-in-flight',
        retryAfterSeconds: 60,
      },
    );
  }
  return { noop: false, window, newEnd, hold, attributes };
}

/**
 * An extend's second transaction, after the IAM allow, in the caller's transaction: the
 * reservation locked and applyExtend run under `hold`; an extend that happened writes its audit
 * row (with the idempotency key and the new end). Answers applyExtend's outcome.
 */
export async function commitExtend(
  trx: Trx,
  input: {
    reservationId: string;
    tenantId: string;
    staged: Extract<StagedExtend, { noop: false }>;
    idempotencyKey: string;
    audit: CallerAudit;
  },
): Promise<ExtendOutcome> {
  await lockReservation(trx, input.reservationId);
  const result = await applyExtend(trx, {
    reservationId: input.reservationId,
    hold: input.staged.hold,
    currentEnd: input.staged.window.end,
    newEnd: input.staged.newEnd,
    attributes: input.staged.attributes,
  });
  if (result.extended) {
    await insertAuditEvent(trx, {
      tenantId: input.tenantId,
      actorIdentityId: input.audit.actorIdentityId,
      action: input.audit.action,
      resourceType: 'compute-reservation',
      resourceId: input.reservationId,
      requestId: input.audit.requestId,
      context: { ...input.audit.context, idempotencyKey: input.idempotencyKey, end: result.end },
    });
  }
  return result;
}

/**
 * Moves the lease to compute_now() + lease_seconds while the reservation is placed, binding or
 * active (without a lifecycle to do it); false when it ended first.
 */
export async function renewLeaseNow(db: Db, reservationId: string): Promise<boolean> {
  const renewed = await db
    .updateTable('reservations')
    .set({
      lease_expires_at: sql<Date>`compute_now() + make_interval(secs => lease_seconds)`,
      version: sql<number>`version + 1`,
      updated_at: sql<Date>`compute_now()`,
    })
    .where('id', '=', reservationId)
    .where('state', 'in', holdingStates)
    .returning('id')
    .executeTakeFirst();
  return Boolean(renewed);
}
