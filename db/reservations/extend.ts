import { sql, type Transaction } from 'kysely';
import type { Database, Db } from '../../core/database.ts';
import { ComputeError } from '../../domain/errors.ts';
import { newId } from '../../domain/ids.ts';
import { maxDurationMs } from '../../domain/reservation-schema.ts';
import { holdingStates, isExtendable } from '../../domain/reservation-states.ts';
import { moveAllocationEnds } from '../allocations/move-ends.ts';
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

/** Clears the pending change and the slot, only when `hold` still owns it, in the caller's transaction. */
async function releaseExtendHold(trx: Trx, reservationId: string, hold: string): Promise<void> {
  const mine = await sql<{ hold: string }>`
    DELETE FROM extend_holds WHERE reservation_id = ${reservationId} AND hold = ${hold} RETURNING hold`.execute(
    trx,
  );
  if (mine.rows.length > 0) await setAuthzPending(trx, 'compute-reservation', reservationId, null);
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
  const moved = await moveAllocationEnds(trx, {
    reservationId: input.reservationId,
    currentEnd: input.currentEnd,
    newEnd: input.newEnd,
  });
  if (!moved.moved) return { extended: false, availableUntil: moved.availableUntil, reason: 'booked' };
  const target = new Date(input.newEnd).toISOString();
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
async function readWindow(
  db: Trx | Db,
  reservationId: string,
): Promise<{ start: number; end: number } | null> {
  const { rows } = await sql<{ s: Date | null; e: Date | null }>`
    SELECT lower(during) AS s, upper(during) AS e FROM reservations WHERE id = ${reservationId}`.execute(db);
  const row = rows[0];
  return row?.s && row.e ? { start: row.s.getTime(), end: row.e.getTime() } : null;
}

/** What an extend asks for: exactly one of a new end (`until`) or a move (`byMs`). */
export interface ExtendTarget {
  until?: number | undefined;
  byMs?: number | undefined;
}

/** INVALID_STATE outside placed, binding or active. */
function checkExtendable(state: string, reservationId: string): void {
  if (!isExtendable(state)) {
    throw new ComputeError(
      'INVALID_STATE',
      `reservation ${reservationId} is ${state}: only placed, binding or active reservations extend`,
      { state },
    );
  }
}

/**
 * INVALID_STATE for a spot reservation under a preemption notice: its capacity is promised to the
 * reservation that preempted it from the deadline on, so its end cannot move later.
 */
function checkNotUnderNotice(row: { id: string; state: string; preempt_notice_until: Date | null }): void {
  if (row.preempt_notice_until === null) return;
  const deadline = new Date(row.preempt_notice_until).getTime();
  throw new ComputeError(
    'INVALID_STATE',
    `reservation ${row.id} is a spot reservation under a preemption notice: it is released at ${new Date(deadline).toISOString()} and cannot be extended; checkpoint before then and reserve again`,
    { state: row.state, preemptAt: deadline },
  );
}

export type PlannedExtend =
  | { noop: true; window: { start: number; end: number } }
  | {
      noop: false;
      window: { start: number; end: number };
      newEnd: number;
      /** The authz attributes with the new `durationHours`: what the IAM decision reads. */
      attributes: Record<string, unknown>;
    };

/**
 * An extend's plan, before its IAM decision, reading only (it takes no lock and no slot, so a
 * caller IAM refuses never holds anything up): the reservation's window, its new end (`until`, or
 * its end moved `byMs` later) and the authz attributes with the new duration. An end no later than
 * the current one is a no-op. INVALID_STATE outside placed/binding/active or without a booked
 * window; INVALID_INPUT (naming `until` or `by`) past 90 days in all.
 */
export async function planExtend(
  db: Db,
  input: { reservationId: string; state: string } & ExtendTarget,
): Promise<PlannedExtend> {
  const { reservationId } = input;
  checkExtendable(input.state, reservationId);
  const window = await readWindow(db, reservationId);
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
  const current = (await readAuthzResource(db, 'compute-reservation', reservationId))?.attributes ?? {};
  const attributes = {
    ...current,
    durationHours: Math.round(((newEnd - window.start) / 3_600_000) * 1000) / 1000,
  };
  return { noop: false, window, newEnd, attributes };
}

/** An extend already committed under a key: what a retry with that key answers. */
export interface CommittedExtend {
  requestHash: string;
  previousEnd: number;
  end: number;
}

/** The extend this caller committed under `idempotencyKey` on this reservation, if any. */
export async function findCommittedExtend(
  db: Trx | Db,
  input: { reservationId: string; actorIdentityId: string; idempotencyKey: string },
): Promise<CommittedExtend | undefined> {
  const row = await db
    .selectFrom('reservation_extends')
    .select(['request_hash', 'previous_end', 'new_end'])
    .where('reservation_id', '=', input.reservationId)
    .where('actor_identity_id', '=', input.actorIdentityId)
    .where('idempotency_key', '=', input.idempotencyKey)
    .executeTakeFirst();
  return row
    ? { requestHash: row.request_hash, previousEnd: row.previous_end.getTime(), end: row.new_end.getTime() }
    : undefined;
}

/** What an extend committed earlier under the same key answers: its own result, unchanged. */
export interface ReplayedExtend {
  extended: true;
  end: number;
  replayed: true;
}

/**
 * The answer to a repeated key: the same request answers its committed extend again (nothing
 * changes twice); another request under that key is CONFLICT with details.reservationId.
 */
export function replayCommittedExtend(
  committed: CommittedExtend,
  input: { reservationId: string; idempotencyKey: string; requestHash: string },
): ReplayedExtend {
  if (committed.requestHash !== input.requestHash) {
    throw new ComputeError(
      'CONFLICT',
      `idempotencyKey: '${input.idempotencyKey}' already extended reservation ${input.reservationId} with a different request; use a new key`,
      { reservationId: input.reservationId },
    );
  }
  return { extended: true, end: committed.end, replayed: true };
}

/**
 * An extend's one transaction, after the IAM allow, in the caller's transaction: the reservation
 * locked; a key this caller already committed answers that extend (nothing changes twice); the
 * state and window re-checked (a `by` extend whose end another extend moved since its plan is
 * CONFLICT: its decision was about another end); the extend slot taken (CONFLICT while another
 * extend holds it), applyExtend run under it, and the slot released whatever happened. An extend
 * that happened stores its key and request hash and writes its audit row (with the key and the new
 * end). Codes: INVALID_STATE, CONFLICT, INTERNAL.
 */
export async function commitExtend(
  trx: Trx,
  input: {
    reservationId: string;
    tenantId: string;
    target: ExtendTarget;
    planned: Extract<PlannedExtend, { noop: false }>;
    idempotencyKey: string;
    requestHash: string;
    audit: CallerAudit;
  },
): Promise<ExtendOutcome | ReplayedExtend> {
  const { reservationId } = input;
  const locked = await lockReservation(trx, reservationId);
  if (!locked) throw new ComputeError('INTERNAL', `reservation ${reservationId} is gone`);
  const committed = await findCommittedExtend(trx, {
    reservationId,
    actorIdentityId: input.audit.actorIdentityId,
    idempotencyKey: input.idempotencyKey,
  });
  if (committed) return replayCommittedExtend(committed, input);
  checkExtendable(locked.state, reservationId);
  checkNotUnderNotice(locked);
  const window = await readWindow(trx, reservationId);
  if (!window)
    throw new ComputeError('INVALID_STATE', `reservation ${reservationId} has no booked window to extend`);
  if (window.end !== input.planned.window.end && input.target.until === undefined) {
    throw new ComputeError(
      'CONFLICT',
      `the end of reservation ${reservationId} moved while this extend was decided; retry, and by counts from the new end`,
      { reason: 'end-moved', retryAfterSeconds: 0 },
    );
  }
  if (input.planned.newEnd <= window.end) {
    return { extended: false, availableUntil: window.end, reason: 'booked' };
  }
  const hold = await stageExtend(trx, reservationId, {
    durationHours: input.planned.attributes.durationHours,
  });
  if (!hold) {
    throw new ComputeError(
      'CONFLICT',
      `another extend of reservation ${reservationId} is in flight; retry in a minute`,
      { reason: 'extend-in-flight', retryAfterSeconds: extendHoldSeconds },
    );
  }
  const result = await applyExtend(trx, {
    reservationId,
    hold,
    currentEnd: window.end,
    newEnd: input.planned.newEnd,
    attributes: input.planned.attributes,
  });
  if (!result.extended) {
    await releaseExtendHold(trx, reservationId, hold);
    return result;
  }
  await trx
    .insertInto('reservation_extends')
    .values({
      reservation_id: reservationId,
      actor_identity_id: input.audit.actorIdentityId,
      idempotency_key: input.idempotencyKey,
      request_hash: input.requestHash,
      previous_end: new Date(window.end),
      new_end: new Date(result.end),
    })
    .execute();
  await insertAuditEvent(trx, {
    tenantId: input.tenantId,
    actorIdentityId: input.audit.actorIdentityId,
    action: input.audit.action,
    resourceType: 'compute-reservation',
    resourceId: reservationId,
    requestId: input.audit.requestId,
    context: { ...input.audit.context, idempotencyKey: input.idempotencyKey, end: result.end },
  });
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
