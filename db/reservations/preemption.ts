import { sql, type Transaction } from 'kysely';
import type { Database, Db, Reservation } from '../../core/database.ts';
import { endedAllocationStates } from '../../domain/fleet.ts';
import type { Interval, NodeFit } from '../../domain/placer.ts';
import {
  choosePreemption,
  type PreemptionChoice,
  type PreemptionSummary,
  type SpotHolding,
  shouldPreempt,
  spotNoticeMs,
} from '../../domain/preemption.ts';
import type { Condition } from '../../domain/reservation-lifecycle.ts';
import type { NormalizedRequest } from '../../domain/reservation-request.ts';
import { isTerminal } from '../../domain/reservation-states.ts';
import { PlacementContention, placementRequestOf, tryBook } from '../allocations/placement.ts';
import { loadPlacerNodes } from '../allocations/placement-load.ts';
import { insertAuditEvent } from '../events/audit.ts';
import { literalList } from '../sql-literals.ts';
import { updateReservation } from './lifecycle.ts';
import { recordReservationEvent } from './lifecycle-events.ts';
import { assignReservationDevices } from './lifecycle-nodespec.ts';
import { endCurrentAllocations } from './lifecycle-release.ts';
import { releaseReservation } from './reservations.ts';

type Trx = Transaction<Database>;

export type { PreemptionSummary };

/**
 * Spot preemption in PostgreSQL: the holdings the choice is made from, the one transaction that
 * applies it (notice or re-queue, then the regular booking), and the release at the deadline.
 */

const range = (w: Interval) =>
  sql`tstzrange(${new Date(w.start).toISOString()}::timestamptz, ${new Date(w.end).toISOString()}::timestamptz, '[)')`;

/**
 * The current allocations of a pool's live spot reservations that overlap `horizon` and are not
 * already under a notice, as the choice sees them. Read-only.
 */
export async function loadSpotHoldings(
  db: Db | Trx,
  input: { poolId: string; horizon: Interval },
): Promise<SpotHolding[]> {
  const horizon = range(input.horizon);
  const { rows } = await sql<{
    reservation_id: string;
    node_id: string;
    state: string;
    started_at: Date | null;
    device_ids: string[] | null;
    b_start: Date | null;
    b_end: Date | null;
    resources: Record<string, string> | null;
  }>`
    SELECT a.reservation_id, a.node_id, r.state, lower(r.during) AS started_at,
           array_agg(b.device_id ORDER BY b.device_id) AS device_ids,
           min(lower(b.during)) AS b_start, max(upper(b.during)) AS b_end,
           (SELECT json_object_agg(s.resource, s.amount) FROM scalar_bookings s
             WHERE s.allocation_id = a.id AND s.during && ${horizon}) AS resources
    FROM reservations r JOIN allocations a ON a.reservation_id = r.id
    JOIN device_bookings b ON b.allocation_id = a.id AND b.during && ${horizon}
    WHERE r.pool_id = ${input.poolId} AND r.spot AND r.state IN ('placed', 'binding', 'active')
      AND r.preempt_notice_until IS NULL AND a.superseded_at IS NULL
      AND a.state NOT IN (${literalList(endedAllocationStates)}) AND a.during && ${horizon}
    GROUP BY a.id, a.reservation_id, a.node_id, r.state, r.during`.execute(db);
  return rows
    .filter((r) => r.device_ids?.length && r.b_start && r.b_end)
    .map((r) => ({
      reservationId: r.reservation_id,
      nodeId: r.node_id,
      started: r.state !== 'placed',
      startedAt: r.started_at ? new Date(r.started_at).getTime() : 0,
      deviceIds: r.device_ids!,
      interval: { start: new Date(r.b_start!).getTime(), end: new Date(r.b_end!).getTime() },
      resources: Object.fromEntries(Object.entries(r.resources ?? {}).map(([k, v]) => [k, Number(v)])),
    }));
}

/**
 * Cuts a started spot reservation back to `deadline`: its bookings, its allocations' and its own
 * window. Answers the end it had before (epoch ms), which a called-off preemption restores.
 */
async function cutBackTo(trx: Trx, reservationId: string, deadline: Date): Promise<number | null> {
  const at = deadline.toISOString();
  const before = await sql<{ end: Date | null }>`
    SELECT upper(during) AS "end" FROM reservations WHERE id = ${reservationId}`.execute(trx);
  const originalEnd = before.rows[0]?.end ? new Date(before.rows[0].end).getTime() : null;
  const current = sql`SELECT id FROM allocations WHERE reservation_id = ${reservationId} AND superseded_at IS NULL`;
  for (const table of [sql.raw('device_bookings'), sql.raw('scalar_bookings')]) {
    await sql`DELETE FROM ${table} WHERE allocation_id IN (${current}) AND lower(during) >= ${at}::timestamptz`.execute(
      trx,
    );
    await sql`UPDATE ${table} SET during = tstzrange(lower(during), ${at}::timestamptz, '[)')
      WHERE allocation_id IN (${current}) AND upper(during) > ${at}::timestamptz`.execute(trx);
  }
  await sql`UPDATE allocations SET during = tstzrange(lower(during), ${at}::timestamptz, '[)'), updated_at = compute_now()
    WHERE reservation_id = ${reservationId} AND superseded_at IS NULL
      AND upper(during) > ${at}::timestamptz AND lower(during) < ${at}::timestamptz`.execute(trx);
  await sql`UPDATE reservations SET during = tstzrange(lower(during), ${at}::timestamptz, '[)'), preempt_notice_until = ${at}::timestamptz
    WHERE id = ${reservationId} AND lower(during) < ${at}::timestamptz`.execute(trx);
  return originalEnd;
}

function conditionsOf(row: Reservation, without: string): Condition[] {
  return ((row.conditions ?? []) as Condition[]).filter((c) => c.type !== without);
}

/** A preemption the placer would make: the choice, its notice deadline and the pool's notice. */
export interface PlannedPreemption {
  choice: PreemptionChoice;
  /** When the noticed spot reservations would be released (epoch ms). */
  deadline: number;
  noticeMs: number;
}

/**
 * Which spot reservations a regular request that does not fit over `window` would preempt, and
 * from when, reading only (capacity.preview answers it; preemptSpotFor applies it under locks):
 * null for a spot request or a gang, when waiting (`earliestStart`) takes no longer than the
 * pool's notice, or when no set of spot reservations on one node makes it fit.
 */
export async function planSpotPreemption(
  db: Db | Trx,
  input: {
    poolId: string;
    policy: unknown;
    request: NormalizedRequest;
    now: number;
    window: Interval;
    earliestStart: number | null;
  },
): Promise<PlannedPreemption | null> {
  const { request } = input;
  // Whole machines (binding 'node') are leased only when free: never by preempting spot work.
  if (request.spot || (request as { gang?: unknown }).gang || request.binding === 'node') return null;
  const noticeMs = spotNoticeMs(input.policy);
  const durationMs = input.window.end - input.window.start;
  const deadline = Math.max(input.window.start, input.now + noticeMs);
  if (!shouldPreempt({ spot: false, earliestStart: input.earliestStart, deadline })) return null;
  const late = { start: deadline, end: deadline + durationMs };
  const horizon = { start: input.window.start, end: late.end };
  const holdings = await loadSpotHoldings(db, { poolId: input.poolId, horizon });
  if (holdings.length === 0) return null;
  const placement = placementRequestOf(request);
  const nodes = await loadPlacerNodes(db, {
    poolId: input.poolId,
    deviceClass: placement.deviceClass,
    horizon,
  });
  const choice = choosePreemption({
    nodes,
    holdings,
    request: placement,
    window: late,
    earlyWindow: input.window,
  });
  return choice ? { choice, deadline, noticeMs } : null;
}

/**
 * When a regular request did not fit over `window`, preempts spot reservations so it does, in the
 * caller's transaction (the regular reservation's row locked): nothing for a spot request or a
 * gang, nor when waiting for capacity takes no longer than the pool's notice (`earliestStart` at or
 * before the deadline), nor when no set of spot reservations on one node makes it fit (null).
 * Otherwise the fewest spot reservations on one node (then the most recently started) are locked
 * in id order and: each started one has its bookings cut back to the deadline (its window too),
 * gets `Preempted`/`SpotPreempted` with the deadline, its node's NodeSpec assignment carries
 * `preemptAt`, and `reservation.preempting` is written; each that had not started is re-queued
 * (`pending`, `Unschedulable`/`SpotPreempted`). The regular request is then booked from the
 * deadline (the EXCLUDE constraint referees: the windows touch, never overlap), or over `window`
 * when nothing chosen had started. Throws PlacementContention when a chosen reservation moved on
 * or the booking lost a race (retry the transaction).
 */
export async function preemptSpotFor(
  trx: Trx,
  input: {
    row: Reservation;
    request: NormalizedRequest;
    now: number;
    window: Interval;
    earliestStart: number | null;
  },
): Promise<{ fit: NodeFit; window: Interval; summary: PreemptionSummary } | null> {
  const { row, request } = input;
  if (request.spot || (request as { gang?: unknown }).gang) return null;
  const pool = await trx
    .selectFrom('pools')
    .where('id', '=', row.pool_id)
    .select('policy')
    .executeTakeFirst();
  const planned = await planSpotPreemption(trx, {
    poolId: row.pool_id,
    policy: pool?.policy,
    request,
    now: input.now,
    window: input.window,
    earliestStart: input.earliestStart,
  });
  if (!planned) return null;
  const { choice, deadline, noticeMs } = planned;

  const locked = await trx
    .selectFrom('reservations')
    .where('id', 'in', [...choice.reservationIds].sort())
    .selectAll()
    .orderBy('id')
    .forUpdate()
    .execute();
  const early = choice.window.start < deadline;
  for (const spot of locked) {
    const stillSpot = spot.spot && spot.preempt_notice_until === null && !isTerminal(spot.state);
    const started = spot.state === 'binding' || spot.state === 'active';
    if (
      !stillSpot ||
      spot.state === 'pending' ||
      (early && started) ||
      (!started && spot.state !== 'placed')
    ) {
      throw new PlacementContention();
    }
  }
  if (locked.length !== choice.reservationIds.length) throw new PlacementContention();

  const noticed: string[] = [];
  const requeued: string[] = [];
  const at = new Date(deadline);
  for (const spot of locked) {
    if (spot.state === 'placed') {
      const ended = await endCurrentAllocations(trx, spot.id, 'released');
      const message = `re-queued: its booking was taken by the regular reservation ${row.id} before it started`;
      await updateReservation(trx, spot.id, {
        state: 'pending',
        conditions: [
          ...conditionsOf(spot, 'Unschedulable'),
          { type: 'Unschedulable', reason: 'SpotPreempted', message, since: input.now },
        ],
        pendingSinceNow: true,
      });
      await recordReservationEvent(trx, spot, 'reservation.pending', 'pending', {
        reason: 'SpotPreempted',
        message,
        preemptedBy: row.id,
        releasedAllocations: ended.map((a) => a.id),
      });
      requeued.push(spot.id);
      continue;
    }
    const originalEnd = await cutBackTo(trx, spot.id, at);
    const condition = {
      type: 'Preempted',
      reason: 'SpotPreempted',
      message: `preempted by ${row.id}: released at ${at.toISOString()} (notice ${noticeMs / 1000} s); checkpoint before then`,
      since: input.now,
      deadline,
      preemptedBy: row.id,
      noticeSeconds: noticeMs / 1000,
      // What a called-off preemption gives back (callOffPreemptionsBy).
      ...(originalEnd !== null ? { originalEnd } : {}),
    };
    await updateReservation(trx, spot.id, { conditions: [...conditionsOf(spot, 'Preempted'), condition] });
    await assignReservationDevices(trx, spot.id, spot.binding_kind === 'kubernetes' ? 'kubernetes' : 'hold');
    await recordReservationEvent(trx, spot, 'reservation.preempting', spot.state, {
      deadline,
      noticeSeconds: noticeMs / 1000,
      preemptedBy: row.id,
    });
    noticed.push(spot.id);
  }

  const booked = await tryBook(trx, { fit: choice.fit, window: choice.window, reservationId: row.id });
  if (booked !== 'booked') throw new PlacementContention();
  return {
    fit: choice.fit,
    window: choice.window,
    summary: {
      id: `preemption-${row.id}-${choice.window.start}`,
      reservationId: row.id,
      tenantId: row.tenant_id,
      poolId: row.pool_id,
      deadline: choice.window.start,
      noticeSeconds: noticeMs / 1000,
      noticed,
      requeued,
    },
  };
}

/** Where a preemption stands: compute_now() and the spot reservations still under its notice. */
export async function readPreemption(
  db: Db,
  input: { spotReservationIds: readonly string[]; deadline: number },
): Promise<{ now: number; open: string[] }> {
  const { rows } = await sql<{ now: Date; open: string[] | null }>`
    SELECT compute_now() AS now,
           (SELECT array_agg(id ORDER BY id) FROM reservations WHERE id = ANY(${input.spotReservationIds as string[]}::text[])
              AND preempt_notice_until = ${new Date(input.deadline).toISOString()}::timestamptz
              AND state NOT IN ('released', 'failed', 'cancelled', 'expired', 'denied')) AS open`.execute(db);
  return { now: new Date(rows[0]!.now).getTime(), open: rows[0]!.open ?? [] };
}

/**
 * Releases a spot reservation at its notice deadline, in the caller's transaction: reason
 * `preempted`, event `reservation.preempted` (releaseReservation: bookings ended, NodeSpec
 * assignment withdrawn, quota refunded once) and an audit row naming the preemption workflow.
 * Idempotent and guarded: before the deadline, for a reservation under another notice or already
 * ended, nothing changes (`false`).
 */
export async function releasePreempted(
  trx: Trx,
  input: { reservationId: string; deadline: number; preemptedBy: string },
): Promise<boolean> {
  const { rows } = await sql<{ due: boolean }>`
    SELECT (preempt_notice_until = ${new Date(input.deadline).toISOString()}::timestamptz
            AND compute_now() >= preempt_notice_until) AS due
    FROM reservations WHERE id = ${input.reservationId} FOR UPDATE`.execute(trx);
  if (!rows[0]?.due) return false;
  const released = await releaseReservation(trx, input.reservationId, 'preempted');
  if (!released.changed) return false;
  const row = await trx
    .selectFrom('reservations')
    .where('id', '=', input.reservationId)
    .select(['tenant_id'])
    .executeTakeFirstOrThrow();
  await insertAuditEvent(trx, {
    tenantId: row.tenant_id,
    actorIdentityId: null,
    action: 'compute:lifecycle:preempted',
    resourceType: 'compute-reservation',
    resourceId: input.reservationId,
    context: { actor: 'preemption-workflow', deadline: input.deadline, preemptedBy: input.preemptedBy },
  });
  return true;
}

/** A spot preemption whose workflow should be running: the summary to start it from. */
export type OpenPreemption = PreemptionSummary;

/**
 * The notices still open whose preemption workflow may never have started (a crash between the
 * placement's commit and the start): the live spot reservations under a notice given more than
 * `graceMs` ago, grouped by the reservation that preempted and the deadline, as the summaries
 * their workflows start from (`requeued` empty: re-queued ones need no workflow). At most
 * `limit` groups, oldest deadline first. Read-only.
 */
export async function findOpenPreemptions(
  db: Db,
  input: { graceMs: number; limit: number },
): Promise<OpenPreemption[]> {
  const { rows } = await sql<{
    preempted_by: string;
    deadline: Date;
    notice_seconds: string | null;
    tenant_id: string;
    pool_id: string;
    noticed: string[];
  }>`
    SELECT c->>'preemptedBy' AS preempted_by, r.preempt_notice_until AS deadline,
           max(c->>'noticeSeconds') AS notice_seconds,
           coalesce(p.tenant_id, min(r.tenant_id)) AS tenant_id, min(r.pool_id) AS pool_id,
           array_agg(r.id ORDER BY r.id) AS noticed
    FROM reservations r
    CROSS JOIN LATERAL jsonb_array_elements(r.conditions) c
    LEFT JOIN reservations p ON p.id = c->>'preemptedBy'
    WHERE r.preempt_notice_until IS NOT NULL AND r.spot
      AND r.state IN ('placed', 'binding', 'active')
      AND c->>'type' = 'Preempted' AND c->>'preemptedBy' IS NOT NULL
      AND (c->>'since')::numeric < extract(epoch FROM compute_now()) * 1000 - ${input.graceMs}
    GROUP BY c->>'preemptedBy', r.preempt_notice_until, p.tenant_id
    ORDER BY r.preempt_notice_until
    LIMIT ${input.limit}`.execute(db);
  return rows.map((r) => {
    const deadline = new Date(r.deadline).getTime();
    return {
      id: `preemption-${r.preempted_by}-${deadline}`,
      reservationId: r.preempted_by,
      tenantId: r.tenant_id,
      poolId: r.pool_id,
      deadline,
      noticeSeconds: Number(r.notice_seconds ?? 0),
      noticed: r.noticed,
      requeued: [],
    };
  });
}
