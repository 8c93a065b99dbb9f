import { sql, type Transaction } from 'kysely';
import type { Database, Db } from '../../core/database.ts';
import type { UsageRecord } from '../../core/iam-port.ts';
import type { PoolSharingMode } from '../../domain/fleet.ts';
import { endedStates } from '../../domain/reservation-states.ts';
import { atomMeter, atomWorth } from '../../domain/sharing.ts';

type Trx = Transaction<Database>;

export interface UsageWindow {
  allocationId: string;
  hourStart: Date;
  meter: string;
  quantity: number;
  idempotencyKey: string;
}

/** The meter a reservation's GPU-hours are billed on: `gpu.<model>.hours`, or `gpu.<model>.spot.hours` for spot. */
export function usageMeter(gpuModel: string, spot: boolean): string {
  return `gpu.${gpuModel.toLowerCase()}${spot ? '.spot' : ''}.hours`;
}

/**
 * The closed usage windows of one allocation billed from `from` to `to` (exclusive): one per
 * window of `windowMs` the span touches, the last one only when `final` (the allocation has stopped
 * billing) or when it has ended before `now`. Quantity is GPU-hours. Pure.
 */
export function closedWindows(input: {
  allocationId: string;
  meter: string;
  gpus: number;
  from: number;
  to: number;
  now: number;
  final: boolean;
  windowMs: number;
}): UsageWindow[] {
  const out: UsageWindow[] = [];
  if (input.gpus <= 0 || input.to <= input.from) return out;
  for (let w = Math.floor(input.from / input.windowMs) * input.windowMs; w < input.to; w += input.windowMs) {
    const windowEnd = w + input.windowMs;
    if (windowEnd > input.now && !input.final) break;
    const overlap = Math.min(windowEnd, input.to) - Math.max(w, input.from);
    if (overlap <= 0) continue;
    const hourStart = new Date(w);
    out.push({
      allocationId: input.allocationId,
      hourStart,
      meter: input.meter,
      quantity: Math.round((overlap / 3_600_000) * input.gpus * 1e6) / 1e6,
      idempotencyKey: `usage/${input.allocationId}/${hourStart.toISOString()}/${input.meter}`,
    });
  }
  return out;
}

/**
 * The time up to which billing is settled: compute_now(), or the start of the oldest transaction
 * still open on this database if that is earlier. compute_now() is a transaction's start time, so
 * a release that began before this meter and commits after it stamps `released_at` (or truncates
 * the allocation's window) at that earlier time; a window billed past it would be final and too
 * long. Windows after the horizon wait for a later meter; an allocation already released (or of
 * an ended reservation) is settled and billed to its end at once. (Sessions of other roles show no
 * `xact_start` and are not waited for: the control plane runs under one role.)
 */
const settledHorizon = sql`
  SELECT COALESCE(c.frozen_at, least(now(), (SELECT min(xact_start) FROM pg_stat_activity
    WHERE datname = current_database() AND backend_type = 'client backend' AND xact_start IS NOT NULL))
    + c.offset_by) AS at
  FROM compute_clock c`;

/**
 * Writes the closed usage windows of every bound allocation of a reservation (billing runs from
 * `bound_at`, never before the window's start, and stops at the release or the booking's end).
 * A window once written is final: a retry inserts nothing twice. Answers how many it wrote.
 */
export async function meterReservationUsage(
  trx: Trx,
  reservationId: string,
  windowMs: number,
): Promise<number> {
  const { rows } = await sql<{
    allocation_id: string;
    tenant_id: string;
    gpu_model: string;
    spot: boolean;
    sharing_mode: PoolSharingMode;
    policy: Record<string, unknown> | null;
    bill_from: Date;
    bill_to: Date;
    now: Date;
    final: boolean;
    atoms: Array<{ c: string; p: string | null }> | null;
  }>`
    WITH horizon AS (${settledHorizon})
    SELECT a.id AS allocation_id, r.tenant_id, p.gpu_model, r.spot, p.sharing_mode, p.policy,
      greatest(a.bound_at, lower(a.during)) AS bill_from,
      CASE WHEN s.settled THEN least(coalesce(a.released_at, 'infinity'), upper(a.during), compute_now())
        ELSE least(upper(a.during), h.at) END AS bill_to,
      h.at AS now,
      (s.settled OR upper(a.during) <= h.at) AS final,
      (SELECT json_agg(json_build_object('c', d.class, 'p', d.attributes->>'profile'))
        FROM device_bookings b JOIN devices d ON d.id = b.device_id WHERE b.allocation_id = a.id) AS atoms
    FROM allocations a
    JOIN reservations r ON r.id = a.reservation_id
    JOIN pools p ON p.id = r.pool_id
    CROSS JOIN horizon h
    CROSS JOIN LATERAL (SELECT a.released_at IS NOT NULL
      OR r.state IN (${sql.join(endedStates.map((s) => sql.lit(s)))}) AS settled) s
    WHERE a.reservation_id = ${reservationId} AND a.bound_at IS NOT NULL`.execute(trx);
  let written = 0;
  for (const row of rows) {
    // One meter per atom kind (domain/sharing.ts), each in GPU-hours: hours × the atom's billing weight.
    const perMeter = new Map<string, number>();
    for (const atom of row.atoms ?? []) {
      const meter =
        atom.c === 'gpu'
          ? usageMeter(row.gpu_model, row.spot)
          : atomMeter(row.gpu_model, atom.c, atom.p ?? undefined).replace(
              /\.hours$/,
              row.spot ? '.spot.hours' : '.hours',
            );
      const { billingWeight } = atomWorth({
        deviceClass: atom.c,
        mode: row.sharing_mode,
        policy: row.policy ?? {},
        profile: atom.p ?? undefined,
      });
      perMeter.set(meter, (perMeter.get(meter) ?? 0) + billingWeight);
    }
    const windows = [...perMeter].flatMap(([meter, gpus]) =>
      closedWindows({
        allocationId: row.allocation_id,
        meter,
        gpus,
        from: new Date(row.bill_from).getTime(),
        to: new Date(row.bill_to).getTime(),
        now: new Date(row.now).getTime(),
        final: row.final,
        windowMs,
      }),
    );
    if (windows.length === 0) continue;
    const result = await trx
      .insertInto('usage_windows')
      .values(
        windows.map((w) => ({
          allocation_id: w.allocationId,
          hour_start: w.hourStart,
          meter: w.meter,
          tenant_id: row.tenant_id,
          reservation_id: reservationId,
          quantity: w.quantity,
          idempotency_key: w.idempotencyKey,
        })),
      )
      .onConflict((oc) => oc.columns(['allocation_id', 'hour_start', 'meter']).doNothing())
      .executeTakeFirst();
    written += Number(result.numInsertedOrUpdatedRows ?? 0);
  }
  return written;
}

/** The reservation's usage windows not yet acknowledged by billing, as IAM usage records. */
export async function unsentUsage(db: Db, reservationId: string, windowMs: number): Promise<UsageRecord[]> {
  const rows = await db
    .selectFrom('usage_windows')
    .where('reservation_id', '=', reservationId)
    .where('sent_at', 'is', null)
    .selectAll()
    .orderBy('hour_start')
    .execute();
  return rows.map((row) => ({
    idempotencyKey: row.idempotency_key,
    tenantId: row.tenant_id,
    meter: row.meter,
    quantity: Number(row.quantity),
    windowStart: new Date(row.hour_start),
    windowEnd: new Date(new Date(row.hour_start).getTime() + windowMs),
    subject: `reservation/${reservationId}/allocation/${row.allocation_id}`,
  }));
}

/** Marks windows acknowledged by billing; idempotent. */
export async function markUsageSent(db: Db, idempotencyKeys: readonly string[]): Promise<void> {
  if (idempotencyKeys.length === 0) return;
  await db
    .updateTable('usage_windows')
    .set({ sent_at: sql<Date>`compute_now()` })
    .where('idempotency_key', 'in', idempotencyKeys)
    .where('sent_at', 'is', null)
    .execute();
}
