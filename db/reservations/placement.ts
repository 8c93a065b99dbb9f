import { type Compilable, type RawBuilder, sql, type Transaction } from 'kysely';
import type { AdmissionCaches } from '../../core/admission-caches.ts';
import type { Database, Db, Reservation } from '../../core/database.ts';
import { ComputeError } from '../../domain/errors.ts';
import type { EventType } from '../../domain/event-types.ts';
import { newId } from '../../domain/ids.ts';
import type { Interval } from '../../domain/placer.ts';
import { isUndecided } from '../../domain/reservation-states.ts';
import type { ReservationView } from '../../domain/reservation-view.ts';
import { findAndBookRequest } from '../allocations/gang-placement.ts';
import { recordUnmetDemand, reservationDemand } from '../holds/demand.ts';
import { notifyPoolQueued } from '../notify-channels.ts';
import { preparedMarker } from '../pool.ts';
import { reservationStateEvent } from './lifecycle-events.ts';
import { type PreemptionSummary, preemptSpotFor } from './preemption.ts';
import { chargeQuota, precheckQuotaFree, storedQuotaNeeds } from './quota.ts';
import { type CallerAudit, lockReservationForPlacement } from './reservations.ts';
import { parseStoredRequest } from './stored.ts';

type Trx = Transaction<Database>;

/**
 * Placing a reservation: admission's first placement of its draft (placeDraft) and the
 * lifecycle's retries of a pending one (placeReservation), with one placer and one booking path.
 */

export interface AuditRow {
  tenantId: string;
  actorIdentityId: string | null;
  action: string;
  requestId: string | null;
  context: Record<string, unknown>;
}

/** What a reservation's state update writes with it: its outbox event and its audit row. */
export interface UpdateRecords {
  event?: { type: EventType; subject: string; tenantId: string; data: Record<string, unknown> };
  audit?: AuditRow;
}

/**
 * A reservation's state update with its outbox event and audit row as the CTEs `u` (the update,
 * RETURNING its version), `o` and `a` (written only when `u` changed a row), for one statement.
 */
export function updateWithRecordsCtes(
  reservationId: string,
  update: Compilable & { returning: unknown },
  records: UpdateRecords,
): RawBuilder<unknown> {
  const { event, audit } = records;
  return sql`u AS (${update}),
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
    )`;
}

/**
 * Runs a reservation's state update together with its outbox event and audit row in one
 * statement (data-modifying CTEs), answering the new version: one round trip instead of three.
 */
async function updateWithRecords(
  trx: Trx,
  reservationId: string,
  update: Compilable & { returning: unknown },
  records: UpdateRecords,
): Promise<{ version: number }> {
  const { rows } = await sql<{ version: number; id: string }>`${sql.raw(preparedMarker)}
    WITH ${updateWithRecordsCtes(reservationId, update, records)}
    SELECT version FROM u`.execute(trx);
  if (!rows[0]) throw new ComputeError('INTERNAL', 'the reservation to update is gone');
  return { version: rows[0].version };
}

/** The update that makes a reservation `placed` over `window` (its lease deadline set), no RETURNING yet. */
export function placedUpdate(
  db: Trx | Db,
  row: Pick<Reservation, 'id' | 'lease_seconds'>,
  window: Interval,
  options: { extra?: Record<string, unknown>; topologyValue: string | null },
) {
  return db
    .updateTable('reservations')
    .set({
      ...options.extra,
      state: 'placed',
      during: `[${new Date(window.start).toISOString()},${new Date(window.end).toISOString()})`,
      conditions: '[]',
      gang_topology_value: options.topologyValue,
      pending_since: null,
      lease_expires_at: row.lease_seconds
        ? sql<Date>`compute_now() + make_interval(secs => lease_seconds)`
        : null,
      version: sql<number>`version + 1`,
      updated_at: sql<Date>`compute_now()`,
    })
    .where('id', '=', row.id);
}

export type PlaceOutcome =
  | {
      outcome: 'placed';
      nodeId: string;
      deviceIds: string[];
      start: number;
      end: number;
      version: number;
      /** Spot reservations this placement preempted: start the preemption workflow after commit. */
      preemption?: PreemptionSummary;
      /** The reservation as the API shows it, when the statement that placed it returned it. */
      view?: ReservationView;
    }
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
  // A pool-lease pool has one placer: the retry queues the request for its lease holder's batch.
  if (await placedByPoolLease(trx, row.pool_id)) return requeueLockedReservation(trx, row);
  return placeLockedReservation(trx, row, row.now.getTime(), options);
}

async function placedByPoolLease(trx: Trx, poolId: string): Promise<boolean> {
  const { rows } = await sql<{ placer: string | null }>`
    SELECT policy->>'placer' AS placer FROM pools WHERE id = ${poolId}`.execute(trx);
  return rows[0]?.placer === 'pool-lease';
}

/**
 * A pending reservation's retry in a `pool-lease` pool: `Queued` again (its `Unschedulable`
 * condition kept, with its `since`, so the batch neither loses it nor announces it twice), and
 * the placer notified at commit. Answers `pending`: the batch decides it.
 */
async function requeueLockedReservation(trx: Trx, row: Reservation & { now: Date }): Promise<PlaceOutcome> {
  const kept = (row.conditions as Array<{ type: string }>).filter((c) => c.type !== 'Queued');
  const { rows } = await sql<{ version: number }>`
    UPDATE reservations SET conditions = ${JSON.stringify([{ ...queuedCondition, since: row.now.getTime() }, ...kept])}::jsonb,
      version = version + 1, updated_at = compute_now()
    WHERE id = ${row.id} RETURNING version`.execute(trx);
  await notifyPoolQueued(trx, row.pool_id);
  return {
    outcome: 'pending',
    message: queuedCondition.message,
    earliestStart: null,
    version: rows[0]!.version,
  };
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
  const request = parseStoredRequest(reservationId, row.request);
  const requested = row.requested_start?.getTime() ?? now;
  const durationMs = Number(row.duration_ms);
  const asked = { start: Math.max(now, requested), end: Math.max(now, requested) + durationMs };
  const found = await findAndBookRequest(trx, request, {
    poolId: row.pool_id,
    window: asked,
    durationMs,
    reservationId,
    ...(options.caches ? { caches: options.caches } : {}),
  });
  // A regular request that does not fit may preempt spot reservations (from their notice deadline).
  const preempted = found.placed
    ? null
    : await preemptSpotFor(trx, { row, request, now, window: asked, earliestStart: found.earliestStart });
  const result = preempted
    ? { placed: true as const, fit: preempted.fit, fits: [preempted.fit], topologyValue: null }
    : found;
  const window = preempted?.window ?? asked;
  const start = window.start;
  if (result.placed) {
    const update = placedUpdate(trx, row, window, {
      ...(options.extra ? { extra: options.extra } : {}),
      topologyValue: result.topologyValue,
    }).returning('version');
    const updated = await updateWithRecords(trx, reservationId, update, {
      event: reservationStateEvent(row, 'reservation.placed', 'placed', {
        nodeIds: result.fits.map((f) => f.nodeId),
        ...(request.gang ? { gang: { ...request.gang, topologyValue: result.topologyValue } } : {}),
        start,
        end: window.end,
        ...(preempted
          ? {
              preemption: {
                deadline: preempted.summary.deadline,
                noticed: preempted.summary.noticed,
                requeued: preempted.summary.requeued,
              },
            }
          : {}),
      }),
      audit: options.audit && { ...options.audit, context: { ...options.audit.context, outcome: 'placed' } },
    });
    return {
      outcome: 'placed',
      nodeId: result.fit.nodeId,
      deviceIds: result.fit.deviceIds,
      start,
      end: window.end,
      version: updated.version,
      ...(preempted ? { preemption: preempted.summary } : {}),
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
      ? reservationStateEvent(row, 'reservation.pending', 'pending', {
          reason: 'NoFit',
          message: result.message,
        })
      : undefined,
    audit: options.audit && { ...options.audit, context: { ...options.audit.context, outcome: 'pending' } },
  });
  // Unmet demand, once per reservation however often its placement is retried.
  await recordUnmetDemand(trx, reservationDemand(row, 'pending', result.message));
  return {
    outcome: 'pending',
    message: result.message,
    earliestStart: result.earliestStart,
    version: updated.version,
  };
}

/** Admission's outcome in a `pool-lease` pool: queued for the pool placer's next batch. */
export interface QueuedOutcome {
  outcome: 'queued';
  version: number;
}

/** The condition a reservation waits under for the pool-lease placer's batch. */
export const queuedCondition = {
  type: 'Queued',
  reason: 'PoolPlacer',
  message: "waiting for the pool-lease placer's next batch",
} as const;

/**
 * Admission in a `pool-lease` pool, for a row the caller locked: the reservation becomes `pending`
 * with a `Queued`/`PoolPlacer` condition (its operation `running`), its event `reservation.queued`
 * and audit row written in the same statement, and the pool's placer is notified at commit
 * (notifyPoolQueued). Nothing is booked here: the lease holder's batch places it.
 */
async function queueLockedReservation(
  trx: Trx,
  row: Reservation,
  now: number,
  options: { extra?: Record<string, unknown>; audit?: AuditRow },
): Promise<QueuedOutcome> {
  const update = queuedUpdate(trx, row, now, options.extra).returning('version');
  const updated = await updateWithRecords(trx, row.id, update, {
    event: queuedEvent(row),
    audit: options.audit && { ...options.audit, context: { ...options.audit.context, outcome: 'queued' } },
  });
  await notifyPoolQueued(trx, row.pool_id);
  return { outcome: 'queued', version: updated.version };
}

/** The update that queues a reservation for the pool-lease placer's batch, no RETURNING yet. */
export function queuedUpdate(
  db: Trx | Db,
  row: Pick<Reservation, 'id'>,
  now: number,
  extra?: Record<string, unknown>,
) {
  return db
    .updateTable('reservations')
    .set({
      ...extra,
      state: 'pending',
      conditions: JSON.stringify([{ ...queuedCondition, since: now }]),
      pending_since: sql<Date>`COALESCE(pending_since, compute_now())`,
      version: sql<number>`version + 1`,
      updated_at: sql<Date>`compute_now()`,
    })
    .where('id', '=', row.id);
}

/** The `reservation.queued` event of a reservation queued for the pool-lease placer. */
export function queuedEvent(row: Pick<Reservation, 'id' | 'tenant_id' | 'pool_id'>) {
  return reservationStateEvent(row, 'reservation.queued', 'pending', { reason: 'PoolPlacer' });
}

/**
 * What admission stores with its decision: the admission context on the reservation (`extra`)
 * and the audit row of the call, whose context names the pool (the outcome is added to it).
 */
export function admissionRecords(audit: CallerAudit, row: Pick<Reservation, 'tenant_id' | 'pool_id'>) {
  return {
    extra: { admission_context: JSON.stringify(audit.context), confirmation_id: null },
    audit: { ...audit, tenantId: row.tenant_id, context: { ...audit.context, poolId: row.pool_id } },
  };
}

/**
 * Admission's second transaction, in the caller's transaction (run it through
 * withPlacementTransaction, which retries a lost placement race): the draft locked with
 * compute_now() and the tenant's free quota; a reservation no longer awaiting its decision changes
 * nothing (null). The quota is checked from the free amounts read with the lock before any
 * placement work; then the reservation is placed, or left `pending` with `Unschedulable`
 * (announced), or, in a `pool-lease` pool, queued for the placer's batch (queueLockedReservation);
 * its admission context stored and its audit row written with the outcome; the quota
 * is charged last, so its row locks are held only until commit. Codes: QUOTA_EXCEEDED, INTERNAL.
 */
export async function placeDraft(
  trx: Trx,
  input: {
    reservationId: string;
    /** The call that admitted it: its admission context is stored and is the audit row's context. */
    audit: CallerAudit;
    caches?: AdmissionCaches;
    /** The pool's placer: `pool-lease` queues the reservation for its batch instead of placing it. */
    placer?: 'inline' | 'pool-lease';
  },
): Promise<PlaceOutcome | QueuedOutcome | null> {
  const locked = await lockReservationForPlacement(trx, input.reservationId);
  if (!locked || !isUndecided(locked.state)) return null;
  const needs = storedQuotaNeeds(locked);
  // Fails fast, before placement work; chargeQuota below is the guarded truth.
  precheckQuotaFree(needs, locked.quota);
  const admitted = admissionRecords(input.audit, locked);
  const placed =
    input.placer === 'pool-lease'
      ? await queueLockedReservation(trx, locked, locked.now.getTime(), admitted)
      : await placeLockedReservation(trx, locked, locked.now.getTime(), {
          announcePending: true,
          ...(input.caches ? { caches: input.caches } : {}),
          ...admitted,
        });
  // Quota last: its row locks are then held only until this commit.
  await chargeQuota(trx, {
    reservationId: locked.id,
    tenantId: locked.tenant_id,
    poolId: locked.pool_id,
    needs,
  });
  return placed;
}
