import { sql, type Transaction } from 'kysely';
import type { Database, Db } from '../../core/database.ts';
import { type DemandReason, reservationShape } from '../../domain/demand.ts';
import { isComputeError } from '../../domain/errors.ts';

type Trx = Transaction<Database>;

export interface UnmetDemandEntry {
  /** Once per key: a retry with the same idempotency key (or of the same reservation) adds nothing. */
  dedupeKey: string;
  tenantId: string;
  poolId: string | null;
  source: 'hold' | 'reservation';
  subjectId: string | null;
  shape: string;
  kind?: string | null;
  deviceRequest?: unknown;
  reason: DemandReason;
  message: string;
}

/**
 * Records one unmet request in the ledger, in the caller's transaction (or alone). Idempotent on
 * `dedupeKey`: the first record stands, later ones change nothing. Codes: none.
 */
export async function recordUnmetDemand(db: Db | Trx, entry: UnmetDemandEntry): Promise<void> {
  await sql`
    INSERT INTO unmet_demand (dedupe_key, tenant_id, pool_id, source, subject_id, shape, kind, device_request, reason, message)
    VALUES (${entry.dedupeKey}, ${entry.tenantId}, ${entry.poolId}, ${entry.source}, ${entry.subjectId}, ${entry.shape},
            ${entry.kind ?? null}, ${entry.deviceRequest === undefined ? null : JSON.stringify(entry.deviceRequest)}::jsonb,
            ${entry.reason}, ${entry.message})
    ON CONFLICT (dedupe_key) DO NOTHING`.execute(db);
}

/** The ledger's rows a tenant may read: its own, and every tenant's in the pools it owns. */
const visibleTo = (tenantId: string, poolId: string | undefined) => sql`
  (u.tenant_id = ${tenantId} OR EXISTS (SELECT 1 FROM pools p WHERE p.id = u.pool_id AND p.owner_tenant_id = ${tenantId}))
  AND (${poolId ?? null}::text IS NULL OR u.pool_id = ${poolId ?? null})
  AND u.recorded_at >= w.start`;

/**
 * Records, in the caller's transaction, that a reservation failed for want of capacity (the
 * lifecycle ended it `failed` with a capacity reason, e.g. `max-pending-exceeded`): its ledger
 * entry (written when it went pending) becomes `failed-capacity` with the failure's message, or is
 * written so when it had none. One entry per reservation, so the request is still counted once;
 * idempotent (a retried activity changes nothing more). Codes: none.
 */
export async function recordCapacityFailure(
  trx: Trx,
  row: { id: string; tenant_id: string; pool_id: string; request: unknown },
  message: string,
): Promise<void> {
  const entry = reservationDemand(row, 'failed-capacity', message);
  await sql`
    INSERT INTO unmet_demand AS u (dedupe_key, tenant_id, pool_id, source, subject_id, shape, kind, device_request, reason, message)
    VALUES (${entry.dedupeKey}, ${entry.tenantId}, ${entry.poolId}, ${entry.source}, ${entry.subjectId}, ${entry.shape},
            null, ${JSON.stringify(entry.deviceRequest ?? null)}::jsonb, ${entry.reason}, ${entry.message})
    ON CONFLICT (dedupe_key) DO UPDATE SET reason = EXCLUDED.reason, message = EXCLUDED.message
      WHERE u.reason <> EXCLUDED.reason`.execute(trx);
}

/**
 * The ledger over the last `windowSeconds` before compute_now(): counts by shape, pool, tenant and
 * reason, and the top unmet shapes. Read-only.
 */
export async function readDemandCounts(
  db: Db,
  input: { tenantId: string; poolId?: string | undefined; windowSeconds: number; top: number },
) {
  const base = sql`
    WITH w AS (SELECT compute_now() - make_interval(secs => ${input.windowSeconds}) AS start, compute_now() AS end),
    d AS (
      SELECT u.shape, u.pool_id, u.tenant_id, u.recorded_at, u.reason
      FROM unmet_demand u CROSS JOIN w
      WHERE ${visibleTo(input.tenantId, input.poolId)}
    )`;
  const by = async (column: 'shape' | 'pool_id' | 'tenant_id' | 'reason') => {
    const { rows } = await sql<{ key: string | null; count: string }>`${base}
      SELECT ${sql.ref(column)} AS key, count(*) AS count FROM d GROUP BY 1 ORDER BY 2 DESC, 1 LIMIT 100`.execute(
      db,
    );
    return rows.map((r) => ({ key: r.key ?? 'none', count: Number(r.count) }));
  };
  const [window, byShape, byPool, byTenant, byReason, top] = await Promise.all([
    sql<{ start: Date; end: Date }>`
      SELECT compute_now() - make_interval(secs => ${input.windowSeconds}) AS start, compute_now() AS end`.execute(
      db,
    ),
    by('shape'),
    by('pool_id'),
    by('tenant_id'),
    by('reason'),
    sql<{ shape: string; pool_id: string | null; count: string; last_at: Date }>`${base}
      SELECT shape, pool_id, count(*) AS count, max(recorded_at) AS last_at FROM d
      GROUP BY shape, pool_id ORDER BY count(*) DESC, max(recorded_at) DESC LIMIT ${input.top}`.execute(db),
  ]);
  return {
    window: { start: window.rows[0]!.start.getTime(), end: window.rows[0]!.end.getTime() },
    total: byReason.reduce((n, r) => n + r.count, 0),
    byShape,
    byPool,
    byTenant,
    byReason,
    topShapes: top.rows.map((r) => ({
      shape: r.shape,
      poolId: r.pool_id,
      count: Number(r.count),
      lastAt: r.last_at.getTime(),
    })),
  };
}

export interface PendingReservationRow {
  id: string;
  tenant_id: string;
  pool_id: string;
  request: unknown;
  duration_ms: string;
  requested_start: Date | null;
  pending_since: Date | null;
  conditions: Array<{ type: string; message?: string; earliestStart?: number }>;
  queue_position: string;
  queue_length: string;
  now: Date;
}

/**
 * The pending reservations the tenant may read (its own, and every one in the pools it owns),
 * oldest first, at most `limit`, each with its place in its pool's queue (by pending_since).
 * Read-only.
 */
export async function readPendingForDemand(
  db: Db,
  input: { tenantId: string; poolId?: string | undefined; limit: number },
): Promise<PendingReservationRow[]> {
  const { rows } = await sql<PendingReservationRow>`
    SELECT * FROM (
      SELECT r.id, r.tenant_id, r.pool_id, r.request, r.duration_ms, r.requested_start, r.pending_since, r.conditions,
             row_number() OVER (PARTITION BY r.pool_id ORDER BY r.pending_since NULLS LAST, r.created_at, r.id) AS queue_position,
             count(*) OVER (PARTITION BY r.pool_id) AS queue_length, compute_now() AS now
      FROM reservations r WHERE r.state = 'pending'
    ) q
    WHERE (q.tenant_id = ${input.tenantId}
           OR EXISTS (SELECT 1 FROM pools p WHERE p.id = q.pool_id AND p.owner_tenant_id = ${input.tenantId}))
      AND (${input.poolId ?? null}::text IS NULL OR q.pool_id = ${input.poolId ?? null})
    ORDER BY q.pending_since NULLS LAST, q.id
    LIMIT ${input.limit}`.execute(db);
  return rows;
}

/**
 * The ledger entry of a reservation that went unmet: once per reservation (so once per
 * idempotency key, however often it is retried or re-placed).
 */
export function reservationDemand(
  row: { id: string; tenant_id: string; pool_id: string; request: unknown },
  reason: Extract<DemandReason, 'pending' | 'capacity' | 'quota' | 'failed-capacity'>,
  message: string,
): UnmetDemandEntry {
  const request = row.request as Parameters<typeof reservationShape>[0];
  return {
    dedupeKey: `reservation:${row.id}`,
    tenantId: row.tenant_id,
    poolId: row.pool_id,
    source: 'reservation',
    subjectId: row.id,
    shape: Array.isArray(request?.devices) ? reservationShape(request) : 'unknown request',
    deviceRequest: request?.devices ?? null,
    reason,
    message,
  };
}

/**
 * Records a reservation refused for quota (QUOTA_EXCEEDED) or capacity (CAPACITY_UNAVAILABLE) in
 * the ledger, once per reservation, then throws the refusal on. Any other error is thrown as is.
 */
export async function rethrowRecordingDemand(
  db: Db,
  row: { id: string; tenant_id: string; pool_id: string; request: unknown },
  error: unknown,
): Promise<never> {
  const code = isComputeError(error) ? error.code : null;
  if (code === 'QUOTA_EXCEEDED' || code === 'CAPACITY_UNAVAILABLE') {
    const reason = code === 'QUOTA_EXCEEDED' ? 'quota' : 'capacity';
    await recordUnmetDemand(db, reservationDemand(row, reason, (error as Error).message));
  }
  throw error;
}
