import { type RawBuilder, sql } from 'kysely';
import type { AdmissionCaches } from '../../core/admission-caches.ts';
import type { Db, Reservation } from '../../core/database.ts';
import { newId } from '../../domain/ids.ts';
import { findAndBook, placementRequestOf } from '../allocations/placement.ts';
import { bookingGoes } from '../allocations/try-book.ts';
import { isGuardAbort, isTransientConflict } from '../conflict-retry.ts';
import { notifyPoolQueuedAfterCommit } from '../notify-channels.ts';
import { preparedMarker } from '../pool.ts';
import { reservationStateEvent } from './lifecycle-events.ts';
import {
  admissionRecords,
  type PlaceOutcome,
  placedUpdate,
  type QueuedOutcome,
  queuedEvent,
  queuedUpdate,
  type UpdateRecords,
  updateWithRecordsCtes,
} from './placement.ts';
import { quotaChargeCtes, storedQuotaNeeds } from './quota.ts';
import type { CallerAudit } from './reservations.ts';
import { parseStoredRequest } from './stored.ts';
import { type ReservationViewRow, reservationViewOf } from './view.ts';

/**
 * Admission's second transaction as single statements, for the common case: a draft this very
 * call wrote, for one node, charging quota for one resource. The statement that decides it also
 * makes the draft `placed` (or, in a pool-lease pool, queued) only if it is still the draft of that
 * version, writes its event and audit row, and charges the quota only within the limit; when
 * either guard finds nothing to change, the whole statement fails and nothing of it stays.
 *
 * Where placeDraft takes BEGIN, the lock read, the booking, the update, the quota charge and
 * COMMIT, this takes one statement, and the tenant's quota row is locked only for that
 * statement's own commit (placeDraft holds it across a round trip to COMMIT, so a tenant's
 * concurrent creates queue behind each other's).
 *
 * Answers null, having written nothing, when the common case does not apply or did not decide it:
 * a gang, whole machines, quota in more than one resource (locked in order by chargeQuota), no fit
 * among the warm and sampled nodes, every try lost a race, or a guard refused. The caller then
 * runs placeDraft, which answers each of those as before (pending with its NoFit, preemption,
 * QUOTA_EXCEEDED, a decided reservation left alone).
 */
export interface AtOnceInput {
  /** The draft as writeDraft stored it. */
  row: Reservation;
  /** compute_now() as writeDraft read it: the window starts there (or at the requested start). */
  now: number;
  audit: CallerAudit;
}

/**
 * What both placers write with the decision: the guards, the records and the quota charge; null
 * when the common case does not apply.
 */
export function admissionWrites(input: AtOnceInput) {
  const { row } = input;
  if (row.state !== 'draft') return null;
  const request = parseStoredRequest(row.id, row.request);
  if (request.gang || request.binding === 'node') return null;
  const charged = Object.entries(storedQuotaNeeds(row)).filter(([, amount]) => amount > 0);
  if (charged.length !== 1) return null;
  const [resource, amount] = charged[0]!;
  const admitted = admissionRecords(input.audit, row);
  return {
    request,
    extra: admitted.extra,
    /** The one resource the decision charges, and the audit row of the call. */
    charge: { resource, amount },
    audit: admitted.audit,
    /**
     * The CTEs after the guarded update `u` (with its RETURNING): its records, the quota charge
     * made only when `u` changed the draft, and what must then hold.
     */
    ctes(update: Parameters<typeof updateWithRecordsCtes>[1], records: UpdateRecords, outcome: string) {
      const audit = { ...admitted.audit, context: { ...admitted.audit.context, outcome } };
      const charge = quotaChargeCtes(
        { reservationId: row.id, tenantId: row.tenant_id, poolId: row.pool_id, resource, amount },
        sql<boolean>`EXISTS (SELECT 1 FROM u)`,
      );
      return {
        ctes: sql`${updateWithRecordsCtes(row.id, update, { ...records, audit })}, ${charge.ctes}`,
        holds: sql<boolean>`EXISTS (SELECT 1 FROM u) AND ${charge.charged}`,
        reason: `reservation ${row.id} changed, or its quota for ${resource} ran out, while it was decided`,
      };
    },
  };
}

/** The inline placer: each fit tried by one statement that books it with the writes above. */
export async function placeDraftAtOnce(
  db: Db,
  input: AtOnceInput & { caches: AdmissionCaches },
): Promise<PlaceOutcome | null> {
  const { row, now } = input;
  const writes = admissionWrites(input);
  if (!writes) return null;
  const start = Math.max(now, row.requested_start?.getTime() ?? now);
  const durationMs = Number(row.duration_ms);
  const window = { start, end: start + durationMs };
  const allocationId = newId('alloc');
  let stored: StoredPlacement | null = null;
  const found = await findAndBook(db, {
    poolId: row.pool_id,
    request: placementRequestOf(writes.request),
    window,
    durationMs,
    reservationId: row.id,
    allocationId,
    caches: input.caches,
    atOnce: (fit) => ({
      ...writes.ctes(
        placedUpdate(db, row, window, { extra: writes.extra, topologyValue: null })
          .where('state', '=', 'draft')
          .where('version', '=', row.version)
          .where(bookingGoes)
          .returningAll(),
        {
          event: reservationStateEvent(row, 'reservation.placed', 'placed', {
            nodeIds: [fit.nodeId],
            start: window.start,
            end: window.end,
          }),
        },
        'placed',
      ),
      // The placed row as the statement wrote it, and the fit's atoms in the view's order.
      returned: {
        select: sql`(SELECT to_jsonb(u) || jsonb_build_object('start', lower(u.during), 'end', upper(u.during),
                       'device_ids', (SELECT jsonb_agg(d ORDER BY d) FROM unnest(${fit.deviceIds as string[]}::text[]) AS d))
                     FROM u)`,
        receive: (value) => {
          stored = value as StoredPlacement;
        },
      },
    }),
  });
  if (!found.placed || !stored) return null;
  const placed: StoredPlacement = stored;
  const date = (value: string | null) => (value === null ? null : new Date(value));
  // What readReservationView would read now, from what the statement wrote (no read after it).
  const view = reservationViewOf({
    ...placed,
    start: date(placed.start),
    end: date(placed.end),
    lease_expires_at: date(placed.lease_expires_at),
    created_at: new Date(placed.created_at),
    updated_at: new Date(placed.updated_at),
    allocations: [
      {
        id: allocationId,
        nodeId: found.fit.nodeId,
        nodeName: found.fit.nodeName,
        gangIndex: 0,
        state: 'planned',
        deviceIds: placed.device_ids,
        binding: null,
      },
    ],
    repairs: [],
  });
  return {
    outcome: 'placed',
    nodeId: found.fit.nodeId,
    deviceIds: found.fit.deviceIds,
    start: window.start,
    end: window.end,
    version: placed.version,
    view,
  };
}

/** The placed reservation row as the statement returns it (JSON: timestamps as strings). */
type StoredPlacement = Omit<
  ReservationViewRow,
  'start' | 'end' | 'lease_expires_at' | 'created_at' | 'updated_at' | 'allocations' | 'repairs'
> & {
  start: string | null;
  end: string | null;
  lease_expires_at: string | null;
  created_at: string;
  updated_at: string;
  device_ids: string[];
};

/**
 * The pool-lease placer: the draft queued for the lease holder's batch in one statement with the
 * writes above, the placer notified once it has committed.
 */
export async function queueDraftAtOnce(
  db: Db,
  input: AtOnceInput & { onNotifyError: (error: unknown) => void },
): Promise<QueuedOutcome | null> {
  const { row } = input;
  const writes = admissionWrites(input);
  if (!writes) return null;
  const decided = writes.ctes(
    queuedUpdate(db, row, input.now, writes.extra)
      .where('state', '=', 'draft')
      .where('version', '=', row.version)
      .returning('version'),
    { event: queuedEvent(row) },
    'queued',
  );
  const aborted: RawBuilder<unknown> = sql`CASE WHEN EXISTS (SELECT 1 FROM u) AND NOT (${decided.holds})
    THEN compute_abort(${decided.reason}) END`;
  try {
    const { rows } = await sql<{ version: number | null }>`${sql.raw(preparedMarker)}
      WITH ${decided.ctes}
      SELECT (SELECT version FROM u) AS version, ${aborted} AS aborted`.execute(db);
    const version = rows[0]?.version;
    if (version === null || version === undefined) return null;
    // After the commit, not in it (see notifyPoolQueuedAfterCommit).
    notifyPoolQueuedAfterCommit(db, row.pool_id, input.onNotifyError);
    return { outcome: 'queued', version };
  } catch (error) {
    // Undone whole either way: placeDraft decides it (and retries a deadlock).
    if (isGuardAbort(error) || isTransientConflict(error)) return null;
    throw error;
  }
}
