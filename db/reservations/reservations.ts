import { type Compilable, sql, type Transaction } from 'kysely';
import type { AdmissionCaches } from '../../core/admission-caches.ts';
import type { Database, Reservation } from '../../core/database.ts';
import { ComputeError } from '../../domain/errors.ts';
import { newId } from '../../domain/ids.ts';
import { isTerminal } from '../../domain/reservation-lifecycle.ts';
import type { NormalizedRequest } from '../../domain/reservation-request.ts';
import { findAndBook, placementRequestOf } from '../allocations/placement.ts';
import { insertOutboxEvent } from '../events/outbox.ts';
import { preparedMarker } from '../pool.ts';
import { endCurrentAllocations, refundReservationQuota } from './lifecycle-release.ts';

type Trx = Transaction<Database>;

/** Quota rows of a tenant in a pool, by resource. */
export type QuotaRows = Record<string, { limit: number | string; used: number | string }>;

export async function lockReservation(trx: Trx, reservationId: string): Promise<Reservation | undefined> {
  return trx
    .selectFrom('reservations')
    .selectAll()
    .where('id', '=', reservationId)
    .forUpdate()
    .executeTakeFirst();
}

/** The row locked, with compute_now() and the tenant's free quota in its pool, in one round trip. */
export async function lockReservationForPlacement(
  trx: Trx,
  reservationId: string,
): Promise<(Reservation & { now: Date; quota: QuotaRows | null }) | undefined> {
  const { rows } = await sql<Reservation & { now: Date; quota: QuotaRows | null }>`${sql.raw(preparedMarker)}
    SELECT r.*, compute_now() AS now,
           (SELECT json_object_agg(q.resource, json_build_object('limit', q.limit_amount, 'used', q.used)) FROM quotas q
             WHERE q.tenant_id = r.tenant_id AND q.pool_id = r.pool_id) AS quota
    FROM reservations r WHERE r.id = ${reservationId} FOR UPDATE OF r`.execute(trx);
  return rows[0];
}

export interface AuditRow {
  tenantId: string;
  actorIdentityId: string | null;
  action: string;
  requestId: string | null;
  context: Record<string, unknown>;
}

/**
 * Runs a reservation's state update together with its outbox event and audit row in one
 * statement (data-modifying CTEs), answering the new version: one round trip instead of three.
 */
async function updateWithRecords(
  trx: Trx,
  reservationId: string,
  update: Compilable & { returning: unknown },
  records: {
    event?: { type: string; subject: string; tenantId: string; data: Record<string, unknown> };
    audit?: AuditRow;
  },
): Promise<{ version: number }> {
  const event = records.event;
  const audit = records.audit;
  const { rows } = await sql<{ version: number; id: string }>`${sql.raw(preparedMarker)}
    WITH u AS (${update}),
    o AS (
      INSERT INTO outbox_events (id, type, subject, tenant_id, data)
      SELECT ${newId('evt')}, ${event?.type ?? ''}, ${event?.subject ?? ''}, ${event?.tenantId ?? null},
             ${JSON.stringify(event?.data ?? {})}::jsonb
      WHERE ${event !== undefined} AND EXISTS (SELECT 1 FROM u)
    ),
    a AS (
      INSERT INTO audit_events (tenant_id, actor_identity_id, action, resource_type, resource_id, outcome, request_id, context)
      SELECT ${audit?.tenantId ?? null}, ${audit?.actorIdentityId ?? null}, ${audit?.action ?? ''}, 'compute-reservation',
             ${reservationId}, 'allowed', ${audit?.requestId ?? null},
             ${JSON.stringify(audit?.context ?? {})}::jsonb
      WHERE ${audit !== undefined} AND EXISTS (SELECT 1 FROM u)
    )
    SELECT version FROM u`.execute(trx);
  if (!rows[0]) throw new ComputeError('INTERNAL', 'the reservation to update is gone');
  return { version: rows[0].version };
}

export type PlaceOutcome =
  | { outcome: 'placed'; nodeId: string; deviceIds: string[]; start: number; end: number; version: number }
  | { outcome: 'pending'; message: string; earliestStart: number | null; version: number }
  | { outcome: 'unchanged'; state: string | null };

/**
 * Places a `pending` reservation in the caller's transaction, with the inline placer: the window
 * starts at the requested start while it is still ahead, else at compute_now(), for the full
 * duration. Placed: one allocation with its device and scalar bookings, state `placed`, the lease
 * deadline set, event `reservation.placed`. No fit: it stays `pending` with an `Unschedulable` /
 * `NoFit` condition whose message is the placer's summary and the earliest start within 14 days
 * (event `reservation.pending` only with `announcePending`). Idempotent: any other state changes
 * nothing (`unchanged`). Throws PlacementContention when it lost a race (retry the transaction,
 * e.g. through withPlacementTransaction). Codes: INTERNAL only.
 */
export async function placeReservation(
  trx: Trx,
  reservationId: string,
  options: { announcePending?: boolean; caches?: AdmissionCaches } = {},
): Promise<PlaceOutcome> {
  const row = await lockReservationForPlacement(trx, reservationId);
  if (row?.state !== 'pending') return { outcome: 'unchanged', state: row?.state ?? null };
  return placeLockedReservation(trx, row, row.now.getTime(), options);
}

/**
 * placeReservation's body for a row the caller already locked (admission places its draft
 * directly): whatever its state before, it ends `placed` or `pending`.
 */
export async function placeLockedReservation(
  trx: Trx,
  row: Reservation,
  now: number,
  options: {
    announcePending?: boolean;
    extra?: Record<string, unknown>;
    /** An audit row written with the outcome (its context gains `outcome`), in the same statement. */
    audit?: AuditRow;
    /** Admission's caches (the placer's heuristic inputs). */
    caches?: AdmissionCaches;
  } = {},
): Promise<PlaceOutcome> {
  const reservationId = row.id;
  const request = row.request as unknown as NormalizedRequest;
  const requested = row.requested_start?.getTime() ?? now;
  const start = Math.max(now, requested);
  const durationMs = Number(row.duration_ms);
  const window = { start, end: start + durationMs };
  const result = await findAndBook(trx, {
    poolId: row.pool_id,
    request: placementRequestOf(request),
    window,
    durationMs,
    reservationId,
    ...(options.caches ? { caches: options.caches } : {}),
  });
  if (result.placed) {
    const update = trx
      .updateTable('reservations')
      .set({
        ...options.extra,
        state: 'placed',
        during: `[${new Date(start).toISOString()},${new Date(window.end).toISOString()})`,
        conditions: '[]',
        pending_since: null,
        lease_expires_at: row.lease_seconds
          ? sql<Date>`compute_now() + make_interval(secs => lease_seconds)`
          : null,
        version: sql<number>`version + 1`,
        updated_at: sql<Date>`compute_now()`,
      })
      .where('id', '=', reservationId)
      .returning('version');
    const updated = await updateWithRecords(trx, reservationId, update, {
      event: {
        type: 'reservation.placed',
        subject: `reservation/${reservationId}`,
        tenantId: row.tenant_id,
        data: {
          reservationId,
          state: 'placed',
          poolId: row.pool_id,
          nodeIds: [result.fit.nodeId],
          start,
          end: window.end,
        },
      },
      audit: options.audit && { ...options.audit, context: { ...options.audit.context, outcome: 'placed' } },
    });
    return {
      outcome: 'placed',
      nodeId: result.fit.nodeId,
      deviceIds: result.fit.deviceIds,
      start,
      end: window.end,
      version: updated.version,
    };
  }
  const previous = (row.conditions as Array<{ type: string; message: string; since?: number }>).find(
    (c) => c.type === 'Unschedulable',
  );
  const condition = {
    type: 'Unschedulable',
    reason: 'NoFit',
    message: result.message,
    since: previous?.since ?? now,
    ...(result.earliestStart !== null ? { earliestStart: result.earliestStart } : {}),
  };
  const update = trx
    .updateTable('reservations')
    .set({
      ...options.extra,
      state: 'pending',
      conditions: JSON.stringify([condition]),
      pending_since: sql<Date>`COALESCE(pending_since, compute_now())`,
      version: sql<number>`version + 1`,
      updated_at: sql<Date>`compute_now()`,
    })
    .where('id', '=', reservationId)
    .returning('version');
  const updated = await updateWithRecords(trx, reservationId, update, {
    event: options.announcePending
      ? {
          type: 'reservation.pending',
          subject: `reservation/${reservationId}`,
          tenantId: row.tenant_id,
          data: {
            reservationId,
            state: 'pending',
            poolId: row.pool_id,
            reason: 'NoFit',
            message: result.message,
          },
        }
      : undefined,
    audit: options.audit && { ...options.audit, context: { ...options.audit.context, outcome: 'pending' } },
  });
  return {
    outcome: 'pending',
    message: result.message,
    earliestStart: result.earliestStart,
    version: updated.version,
  };
}

export type ReleaseReason = 'release' | 'cancel' | 'expired' | 'lease-lapsed' | 'preempted';

/**
 * Ends a reservation at compute_now() in the caller's transaction: the current booking of every
 * allocation is truncated, future ones deleted, allocations leave their node's NodeSpec, quota is
 * refunded once. A placed/binding/active reservation becomes `released` (`end_reason` = reason);
 * a draft, pending or awaiting-confirmation one (or any with reason `cancel`) becomes `cancelled`.
 * Idempotent: a terminal reservation changes nothing (`changed: false`). Writes
 * `reservation.released` (with `reason`) or `reservation.cancelled` to the outbox.
 */
export async function releaseReservation(
  trx: Trx,
  reservationId: string,
  reason: ReleaseReason,
): Promise<{ changed: boolean; state: string | null; poolId: string | null; freed: boolean }> {
  const row = await lockReservation(trx, reservationId);
  if (!row) return { changed: false, state: null, poolId: null, freed: false };
  if (isTerminal(row.state)) return { changed: false, state: row.state, poolId: row.pool_id, freed: false };
  const wasPlaced = ['placed', 'binding', 'active', 'releasing'].includes(row.state);
  const state = wasPlaced && reason !== 'cancel' ? 'released' : 'cancelled';
  const ended = await endCurrentAllocations(trx, reservationId, 'released');
  await trx
    .updateTable('allocations')
    .set({
      during: sql<string>`CASE WHEN lower(during) >= compute_now() THEN during
        WHEN upper(during) > compute_now() THEN tstzrange(lower(during), compute_now(), '[)') ELSE during END`,
    })
    .where('reservation_id', '=', reservationId)
    .execute();
  await trx
    .updateTable('reservations')
    .set({
      state,
      end_reason: reason,
      during: sql<string>`CASE WHEN during IS NULL OR upper(during) <= compute_now() OR lower(during) >= compute_now()
        THEN during ELSE tstzrange(lower(during), compute_now(), '[)') END`,
      version: sql<number>`version + 1`,
      updated_at: sql<Date>`compute_now()`,
    })
    .where('id', '=', reservationId)
    .execute();
  await sql`DELETE FROM extend_holds WHERE reservation_id = ${reservationId}`.execute(trx);
  await insertOutboxEvent(trx, {
    type: state === 'released' ? 'reservation.released' : 'reservation.cancelled',
    subject: `reservation/${reservationId}`,
    tenantId: row.tenant_id,
    data: { reservationId, state, poolId: row.pool_id, reason },
  });
  await refundReservationQuota(trx, reservationId);
  return { changed: true, state, poolId: row.pool_id, freed: ended.length > 0 };
}
