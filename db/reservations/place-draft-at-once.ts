import { sql } from 'kysely';
import type { AdmissionCaches } from '../../core/admission-caches.ts';
import type { Db, Reservation } from '../../core/database.ts';
import { findAndBook, placementRequestOf } from '../allocations/placement.ts';
import { bookingGoes } from '../allocations/try-book.ts';
import { reservationStateEvent } from './lifecycle-events.ts';
import { type PlaceOutcome, placedUpdate, updateWithRecordsCtes } from './placement.ts';
import { quotaChargeCtes, quotaNeeds } from './quota.ts';
import type { CallerAudit } from './reservations.ts';
import { parseStoredHostShare, parseStoredRequest } from './stored.ts';

/**
 * Admission's second transaction as single statements, for the common case: a draft this very
 * call wrote, placed on one node by the inline placer, charging quota for one resource. Each fit
 * is tried by one statement (its own transaction) that books it and, only when it books, makes
 * the draft `placed` (only if it is still the draft of that version), writes its
 * `reservation.placed` event and audit row, and charges the quota (only within the limit); when
 * either guard finds nothing to change, the whole statement fails and nothing of it stays.
 *
 * Where placeDraft takes BEGIN, the lock read, the booking, the update, the quota charge and
 * COMMIT, this takes the booking statement alone, and the tenant's quota row is locked only for
 * that statement's own commit (placeDraft holds it across a round trip to COMMIT, so a tenant's
 * concurrent creates queue behind each other's).
 *
 * Answers null, having written nothing, when the common case does not apply or did not place it:
 * a gang, whole machines, quota in more than one resource (locked in order by chargeQuota), no fit
 * among the warm and sampled nodes, every try lost a race, or a guard refused. The caller then
 * runs placeDraft, which answers each of those as before (pending with its NoFit, preemption,
 * QUOTA_EXCEEDED, a decided reservation left alone).
 */
export async function placeDraftAtOnce(
  db: Db,
  input: {
    /** The draft as writeDraft stored it. */
    row: Reservation;
    /** compute_now() as writeDraft read it: the window starts there (or at the requested start). */
    now: number;
    audit: CallerAudit;
    caches: AdmissionCaches;
  },
): Promise<PlaceOutcome | null> {
  const { row, now } = input;
  if (row.state !== 'draft') return null;
  const request = parseStoredRequest(row.id, row.request);
  if (request.gang || request.binding === 'node') return null;
  const booked = {
    vcpu: request.resources?.vcpu ?? 0,
    memoryGiB: request.resources?.memoryGiB ?? 0,
    hugepages1Gi: request.resources?.hugepages1Gi ?? 0,
  };
  const needs = Object.entries(
    quotaNeeds(request, booked, parseStoredHostShare(row.id, row.host_share)),
  ).filter(([, amount]) => amount > 0);
  if (needs.length !== 1) return null;
  const [resource, amount] = needs[0]!;
  const start = Math.max(now, row.requested_start?.getTime() ?? now);
  const durationMs = Number(row.duration_ms);
  const window = { start, end: start + durationMs };
  // As placeDraft stores and audits it.
  const extra = { admission_context: JSON.stringify(input.audit.context), confirmation_id: null };
  const audit = {
    ...input.audit,
    tenantId: row.tenant_id,
    context: { ...input.audit.context, poolId: row.pool_id, outcome: 'placed' },
  };
  const found = await findAndBook(db, {
    poolId: row.pool_id,
    request: placementRequestOf(request),
    window,
    durationMs,
    reservationId: row.id,
    caches: input.caches,
    atOnce: (fit) => {
      const update = placedUpdate(db, row, window, { extra, topologyValue: null })
        .where('state', '=', 'draft')
        .where('version', '=', row.version)
        .where(bookingGoes)
        .returning('version');
      const records = updateWithRecordsCtes(row.id, update, {
        event: reservationStateEvent(row, 'reservation.placed', 'placed', {
          nodeIds: [fit.nodeId],
          start: window.start,
          end: window.end,
        }),
        audit,
      });
      const charge = quotaChargeCtes(
        { reservationId: row.id, tenantId: row.tenant_id, poolId: row.pool_id, resource, amount },
        sql<boolean>`EXISTS (SELECT 1 FROM u)`,
      );
      return {
        ctes: sql`${records}, ${charge.ctes}`,
        holds: sql<boolean>`EXISTS (SELECT 1 FROM u) AND ${charge.charged}`,
        reason: `reservation ${row.id} changed, or its quota for ${resource} ran out, while it was placed`,
      };
    },
  });
  if (!found.placed) return null;
  return {
    outcome: 'placed',
    nodeId: found.fit.nodeId,
    deviceIds: found.fit.deviceIds,
    start: window.start,
    end: window.end,
    version: row.version + 1,
  };
}
