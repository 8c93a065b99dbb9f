import { type Client, WorkflowNotFoundError } from '@temporalio/client';
import { sql } from 'kysely';
import type { Db } from '../../core/database.ts';
import { liveStates } from '../../domain/reservation-states.ts';
import type { ReservationHistory } from './fault-load.ts';

/** Live reservations (past admission, not terminal) whose lifecycle workflow is not running. */
export async function liveWithoutWorkflow(db: Db, temporal: Client): Promise<string[]> {
  const live = await db.selectFrom('reservations').where('state', 'in', liveStates).select('id').execute();
  const missing: string[] = [];
  for (const { id } of live) {
    try {
      const described = await temporal.workflow.getHandle(id).describe();
      if (described.status.name !== 'RUNNING') missing.push(id);
    } catch (error) {
      if (!(error instanceof WorkflowNotFoundError)) throw error;
      missing.push(id);
    }
  }
  return missing;
}

export interface BillingReport {
  /** Pairs of one allocation's usage windows (same meter) that overlap (must be 0). */
  overlappingWindows: number;
  /** Allocations billed more GPU-hours than they were bound for (must be 0). */
  overbilledAllocations: number;
  /** Ledger records (iam.usage_records) of windows that do not exist, or differ (must be 0). */
  ledgerMismatches: number;
  windows: number;
}

/**
 * No window is billed twice: one allocation's windows never overlap, no allocation is billed more
 * than its bound time × its GPUs, and every record billing received is one window, once.
 */
export async function checkBilling(db: Db, windowMs: number): Promise<BillingReport> {
  const { rows } = await sql<{
    overlapping: number;
    overbilled: number;
    mismatched: number;
    windows: number;
  }>`
    SELECT
      (SELECT count(*)::int FROM usage_windows a JOIN usage_windows b
         ON a.allocation_id = b.allocation_id AND a.meter = b.meter AND a.hour_start < b.hour_start
        AND b.hour_start < a.hour_start + make_interval(secs => ${windowMs / 1000})) AS overlapping,
      (SELECT count(*)::int FROM (
         SELECT w.allocation_id, sum(w.quantity) AS billed,
           (SELECT count(*) FROM device_bookings b WHERE b.allocation_id = w.allocation_id) AS gpus,
           extract(epoch FROM least(coalesce(a.released_at, 'infinity'), upper(a.during), compute_now())
             - greatest(a.bound_at, lower(a.during))) / 3600 AS bound_hours
         FROM usage_windows w JOIN allocations a ON a.id = w.allocation_id
         GROUP BY w.allocation_id, a.released_at, a.during, a.bound_at) t
       WHERE t.billed > t.gpus * t.bound_hours + 0.000005 * t.gpus) AS overbilled,
      (SELECT count(*)::int FROM iam.usage_records r
        LEFT JOIN usage_windows w ON w.idempotency_key = r.idempotency_key
        WHERE w.idempotency_key IS NULL OR w.quantity <> r.quantity) AS mismatched,
      (SELECT count(*)::int FROM usage_windows) AS windows`.execute(db);
  const row = rows[0]!;
  return {
    overlappingWindows: row.overlapping,
    overbilledAllocations: row.overbilled,
    ledgerMismatches: row.mismatched,
    windows: row.windows,
  };
}

/**
 * Where the answers and the records disagree, one line each: a reservation whose state is not the
 * one its release answered, an extend answered with the wrong end (an extend applied twice), a
 * count of `reservation.extended` events other than the extends answered, a workflow that has not
 * finished, or finished in another state than its reservation's. Call it once every reservation
 * was released: then every workflow must end.
 */
export async function historyMismatches(
  db: Db,
  temporal: Client,
  histories: ReservationHistory[],
): Promise<string[]> {
  const problems: string[] = [];
  for (const h of histories) {
    if (!h.id) continue;
    const row = await db
      .selectFrom('reservations')
      .where('id', '=', h.id)
      .select(['state'])
      .executeTakeFirst();
    if (!row) {
      problems.push(`${h.key}: ${h.id} is gone`);
      continue;
    }
    if (h.released && 'state' in h.released && row.state !== h.released.state) {
      problems.push(`${h.key}: released as ${h.released.state} but is ${row.state}`);
    }
    let extendedSoFar = 0;
    let extendsKnown = true;
    for (const e of h.extends) {
      if ('failed' in e) {
        extendsKnown = false;
        continue;
      }
      if (!e.extended) continue;
      extendedSoFar++;
      if (extendsKnown && h.createdEnd !== null && e.end !== h.createdEnd + 60_000 * extendedSoFar) {
        problems.push(
          `${h.key}: extend #${extendedSoFar} answered end ${e.end}, not created end + ${extendedSoFar} min`,
        );
      }
    }
    if (extendsKnown) {
      const events = await db
        .selectFrom('outbox_events')
        .where('subject', '=', `reservation/${h.id}`)
        .where('type', '=', 'reservation.extended')
        .select((eb) => eb.fn.countAll<number>().as('n'))
        .executeTakeFirstOrThrow();
      if (Number(events.n) !== extendedSoFar) {
        problems.push(
          `${h.key}: ${events.n} reservation.extended events for ${extendedSoFar} extends answered`,
        );
      }
    }
    const handle = temporal.workflow.getHandle(h.id);
    const status = (await handle.describe()).status.name;
    if (status !== 'COMPLETED') {
      problems.push(`${h.key}: the workflow of ${h.id} (${row.state}) is ${status}`);
      continue;
    }
    const result = (await handle.result()) as { state?: string } | undefined;
    if (result?.state !== row.state) {
      problems.push(`${h.key}: the workflow ended ${result?.state} but the reservation is ${row.state}`);
    }
  }
  return problems;
}
