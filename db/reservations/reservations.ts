import { sql, type Transaction } from 'kysely';
import type { Database, Db, Reservation } from '../../core/database.ts';
import { ComputeError } from '../../domain/errors.ts';
import { isCancellable, isPlaced, isTerminal } from '../../domain/reservation-states.ts';
import { insertAuditEvent } from '../events/audit.ts';
import { insertOutboxEvent } from '../events/outbox.ts';
import { holdMachinesForCleaning } from '../metal/dedicated-leases.ts';
import { preparedMarker } from '../pool.ts';
import { reservationStateEvent } from './lifecycle-events.ts';
import { endCurrentAllocations, refundReservationQuota } from './lifecycle-release.ts';
import { recordLifecycleWake } from './lifecycle-wakes.ts';
import { type CalledOffPreemption, callOffPreemptionsBy } from './preemption-call-off.ts';
import { beginKubernetesRelease } from './releasing.ts';

type Trx = Transaction<Database>;

/** Who changed a reservation through the API, for its audit row (the admission context as its context). */
export interface CallerAudit {
  actorIdentityId: string;
  action: string;
  requestId: string;
  context: Record<string, unknown>;
}

/** Quota rows of a tenant in a pool, by resource. */
export type QuotaRows = Record<string, { limit: number | string; used: number | string }>;

/** The reservation row, locked until the caller's transaction ends; undefined when there is none. */
export async function lockReservation(trx: Trx, reservationId: string): Promise<Reservation | undefined> {
  return trx
    .selectFrom('reservations')
    .selectAll()
    .where('id', '=', reservationId)
    .forUpdate()
    .executeTakeFirst();
}

/** A reservation of the tenant as its callers may see it (never a draft); undefined otherwise. */
export async function findTenantReservation(
  db: Db,
  tenantId: string,
  reservationId: string,
): Promise<Reservation | undefined> {
  return db
    .selectFrom('reservations')
    .selectAll()
    .where('id', '=', reservationId)
    .where('tenant_id', '=', tenantId)
    .where('state', '<>', 'draft')
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

export type ReleaseReason = 'release' | 'cancel' | 'expired' | 'lease-lapsed' | 'preempted';

/**
 * Ends a reservation at compute_now() in the caller's transaction: the current booking of every
 * allocation is truncated, future ones deleted, allocations leave their node's NodeSpec, quota is
 * refunded once, and the preemptions it made are called off while their notice runs
 * (callOffPreemptionsBy). A placed/binding/active reservation becomes `released` (`end_reason` = reason);
 * a draft, pending or awaiting-confirmation one (or any with reason `cancel`) becomes `cancelled`.
 * An active `kubernetes` binding becomes `releasing` instead (beginKubernetesRelease), until the
 * node reports its GPUs free. Idempotent: a terminal or releasing reservation changes nothing
 * (`changed: false`). Writes
 * `reservation.released` (with `reason`) or `reservation.cancelled` to the outbox.
 */
export async function releaseReservation(
  trx: Trx,
  reservationId: string,
  reason: ReleaseReason,
): Promise<{
  changed: boolean;
  state: string | null;
  poolId: string | null;
  freed: boolean;
  /** Spot reservations whose notice this (preempting) reservation called off by ending. */
  calledOff?: CalledOffPreemption[];
}> {
  const row = await lockReservation(trx, reservationId);
  if (!row) return { changed: false, state: null, poolId: null, freed: false };
  if (isTerminal(row.state)) return { changed: false, state: row.state, poolId: row.pool_id, freed: false };
  // Already released, waiting for pods to let go of the GPUs: its lifecycle finishes it.
  if (row.state === 'releasing')
    return { changed: false, state: row.state, poolId: row.pool_id, freed: false };
  const state = isPlaced(row.state) && reason !== 'cancel' ? 'released' : 'cancelled';
  // A kubernetes binding whose pods may hold its GPUs is releasing until the node reports them free.
  if (state === 'released' && (await beginKubernetesRelease(trx, row, reason))) {
    return { changed: true, state: 'releasing', poolId: row.pool_id, freed: false };
  }
  // Dedicated root: deployed machines keep their bookings until they are wiped.
  if (row.binding_kind === 'node') await holdMachinesForCleaning(trx, row);
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
  // A regular reservation ended during the notice it gave: the spot ones keep their capacity.
  const calledOff = row.spot ? [] : await callOffPreemptionsBy(trx, reservationId);
  await insertOutboxEvent(
    trx,
    reservationStateEvent(
      row,
      state === 'cancelled'
        ? 'reservation.cancelled'
        : reason === 'preempted'
          ? 'reservation.preempted'
          : 'reservation.released',
      state,
      { reason },
    ),
  );
  await refundReservationQuota(trx, reservationId);
  return { changed: true, state, poolId: row.pool_id, freed: ended.length > 0, calledOff };
}

/**
 * A caller's `reservations.release` or `cancel`, in the caller's transaction: releaseReservation
 * and, when it changed anything, the audit row (with the kind and the state it left). A cancel of
 * a reservation that has started is INVALID_STATE and changes nothing. Idempotent like
 * releaseReservation: ending an ended reservation writes nothing.
 */
export async function endReservationForCaller(
  trx: Trx,
  input: {
    reservationId: string;
    tenantId: string;
    kind: 'release' | 'cancel';
    audit: CallerAudit;
    /** A lifecycle runs the reservation: the wake it is owed is recorded (lifecycle-wakes.ts). */
    wakeOwed?: boolean;
  },
): Promise<Awaited<ReturnType<typeof releaseReservation>>> {
  const locked = await lockReservation(trx, input.reservationId);
  if (input.kind === 'cancel' && locked && !isCancellable(locked.state)) {
    throw new ComputeError(
      'INVALID_STATE',
      `reservation ${input.reservationId} is ${locked.state}: only a pending or placed reservation that has not started can be cancelled; release it instead`,
      { state: locked.state },
    );
  }
  const released = await releaseReservation(trx, input.reservationId, input.kind);
  if (released.changed) {
    await insertAuditEvent(trx, {
      tenantId: input.tenantId,
      actorIdentityId: input.audit.actorIdentityId,
      action: input.audit.action,
      resourceType: 'compute-reservation',
      resourceId: input.reservationId,
      requestId: input.audit.requestId,
      context: { ...input.audit.context, kind: input.kind, state: released.state },
    });
    if (input.wakeOwed) await recordLifecycleWake(trx, input.reservationId, input.kind);
  }
  return released;
}
