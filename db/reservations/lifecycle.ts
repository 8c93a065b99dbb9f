import { sql, type Transaction } from 'kysely';
import type { Database, Db } from '../../core/database.ts';
import { machineLeaseTimers } from '../../domain/dedicated-root.ts';
import { readPoolPolicy } from '../../domain/pool-policy.ts';
import {
  type AllocationView,
  type Condition,
  defaultTimers,
  type LifecycleTimers,
  type ReservationSnapshot,
} from '../../domain/reservation-lifecycle.ts';
import { liveStates, type ReservationState } from '../../domain/reservation-states.ts';
import { runningMachineWorkflowIds } from '../metal/dedicated-leases.ts';
import { parseStoredRequest } from './stored.ts';

type Trx = Transaction<Database>;

const ms = (value: Date | string | null | undefined): number | null =>
  value === null || value === undefined ? null : new Date(value).getTime();

const timerKeys = Object.keys(defaultTimers) as Array<keyof LifecycleTimers>;

/**
 * The timers of a pool: the defaults, the pool's `maxPendingSeconds` as the pending limit, any of
 * `policy.timers` (milliseconds), then the workflow's own overrides (the lifecycle's `timers`).
 */
export function effectiveTimers(
  policy: Record<string, unknown>,
  overrides: Partial<LifecycleTimers> = {},
): LifecycleTimers {
  const timers = { ...defaultTimers };
  const read = readPoolPolicy(policy);
  const fromPolicy: Partial<Record<keyof LifecycleTimers, number>> = read.timers ?? {};
  if (read.maxPendingSeconds !== undefined) timers.maxPendingMs = read.maxPendingSeconds * 1000;
  for (const key of timerKeys) {
    const value = fromPolicy[key];
    if (typeof value === 'number' && value > 0) timers[key] = value;
    const override = overrides[key];
    if (typeof override === 'number' && override > 0) timers[key] = override;
  }
  return timers;
}

/**
 * Reads one reservation as the lifecycle sees it, in `db` or a transaction: its row, the current
 * placement's allocations (those the control plane has not released), whether its pool is still
 * there for the tenant, and compute_now(). Null when there is no such reservation; INTERNAL
 * (naming it) when its stored request does not parse by the stored request's schema.
 */
export async function readReservationSnapshot(
  db: Db | Trx,
  reservationId: string,
  overrides: Partial<LifecycleTimers> = {},
): Promise<ReservationSnapshot | null> {
  const row = await db
    .selectFrom('reservations as r')
    .innerJoin('pools as p', 'p.id', 'r.pool_id')
    .where('r.id', '=', reservationId)
    .select([
      'r.id',
      'r.tenant_id',
      'r.pool_id',
      'r.state',
      'r.version',
      'r.lease_seconds',
      'r.lease_expires_at',
      'r.bind_attempts',
      'r.bind_deadline',
      'r.pending_since',
      'r.confirmation_expires_at',
      'r.end_reason',
      'r.conditions',
      'r.gang_size',
      'r.binding_kind',
      'r.request',
      'p.policy',
      'p.gpu_model',
      'p.archived_at',
      'p.owner_tenant_id',
      sql<Date | null>`lower(r.during)`.as('start'),
      sql<boolean>`r.requested_start IS NOT NULL AND r.requested_start > r.created_at`.as('calendar'),
      sql<Date | null>`upper(r.during)`.as('end'),
      'r.preempt_notice_until',
      sql<Date>`compute_now()`.as('now'),
      sql<boolean>`p.archived_at IS NULL AND (p.owner_tenant_id = r.tenant_id OR EXISTS (
        SELECT 1 FROM pool_offers o WHERE o.pool_id = r.pool_id AND o.tenant_id = r.tenant_id))`.as(
        'pool_available',
      ),
    ])
    .executeTakeFirst();
  if (!row) return null;
  const allocations = await db
    .selectFrom('allocations as a')
    .innerJoin('nodes as n', 'n.id', 'a.node_id')
    .where('a.reservation_id', '=', reservationId)
    .where('a.superseded_at', 'is', null)
    .select([
      'a.id',
      'a.node_id',
      'a.state',
      'a.bound_at',
      'a.binding_lost_at',
      'a.gang_index',
      'a.member_attempt',
      'n.connectivity',
      sql<Date>`upper(a.during)`.as('until'),
      sql<Date | null>`(SELECT max(upper(b.during)) FROM device_bookings b WHERE b.allocation_id = a.id)`.as(
        'booked_until',
      ),
      sql<
        string | null
      >`(SELECT e->>'until' FROM jsonb_array_elements(CASE WHEN jsonb_typeof(n.spec->'devices') = 'array'
        THEN n.spec->'devices' ELSE '[]'::jsonb END) AS e WHERE e->>'allocationId' = a.id LIMIT 1)`.as(
        'assigned_until',
      ),
      sql<boolean>`EXISTS (SELECT 1 FROM node_conditions c WHERE c.node_id = a.node_id
        AND c.type = 'ForeignGpuExposure')`.as('foreign_gpu_exposure'),
      sql<string[] | null>`(SELECT array_agg(d.stable_id ORDER BY d.stable_id) FROM device_bookings b
        JOIN devices d ON d.id = b.device_id WHERE b.allocation_id = a.id AND d.health = 'unhealthy')`.as(
        'unhealthy_atoms',
      ),
    ])
    .orderBy('a.gang_index')
    .orderBy('a.id')
    .execute();
  const policy = (typeof row.policy === 'string' ? JSON.parse(row.policy) : row.policy) as Record<
    string,
    unknown
  >;
  const request = parseStoredRequest(row.id, row.request);
  const devices = request.devices.map((d) => `${d.count}×${d.class}`).join('+');
  return {
    id: row.id,
    tenantId: row.tenant_id,
    poolId: row.pool_id,
    state: row.state as ReservationState,
    version: row.version,
    now: ms(row.now)!,
    start: ms(row.start),
    end: ms(row.end),
    leaseSeconds: row.lease_seconds,
    leaseExpiresAt: ms(row.lease_expires_at),
    bindAttempts: row.bind_attempts,
    bindDeadline: ms(row.bind_deadline),
    pendingSince: ms(row.pending_since),
    confirmationExpiresAt: ms(row.confirmation_expires_at),
    endReason: row.end_reason,
    conditions: (row.conditions ?? []) as Condition[],
    allocations: allocations.map(
      (a): AllocationView => ({
        id: a.id,
        nodeId: a.node_id,
        state: a.state,
        boundAt: ms(a.bound_at),
        until: ms(a.until)!,
        ...(a.booked_until ? { bookedUntil: ms(a.booked_until)! } : {}),
        assignedUntil: a.assigned_until === null ? null : Number(a.assigned_until),
        ...(a.binding_lost_at ? { bindingLost: true } : {}),
        ...(a.connectivity === 'unreachable' ? { nodeUnreachable: true } : {}),
        ...(a.foreign_gpu_exposure ? { foreignGpuExposure: true } : {}),
        ...(a.unhealthy_atoms?.length ? { unhealthyAtoms: a.unhealthy_atoms } : {}),
        ...(row.gang_size > 1 ? { gangIndex: a.gang_index, memberAttempt: a.member_attempt } : {}),
      }),
    ),
    poolAvailable: row.pool_available,
    // A dedicated-root lease: 2 hours to deploy, one attempt (domain/dedicated-root.ts).
    timers:
      row.binding_kind === 'node'
        ? machineLeaseTimers(effectiveTimers(policy, overrides))
        : effectiveTimers(policy, overrides),
    summary: `${row.tenant_id}: ${devices} ${row.gpu_model} (${row.binding_kind}${
      row.gang_size > 1 ? `, gang of ${row.gang_size}` : ''
    }) in ${row.pool_id}`,
    ...(row.gang_size > 1 ? { gangSize: row.gang_size } : {}),
    ...(row.preempt_notice_until ? { preemptAt: ms(row.preempt_notice_until)! } : {}),
    ...(row.calendar ? { calendar: true } : {}),
    ...(row.binding_kind === 'node'
      ? { machineWorkflowIds: await runningMachineWorkflowIds(db, row.id) }
      : {}),
  };
}

/**
 * Locks the reservation row and answers it only when its version is still `expectedVersion`: the
 * guard that makes every lifecycle activity idempotent (a retry after a commit finds a newer version
 * and changes nothing).
 */
export async function lockReservationAtVersion(trx: Trx, reservationId: string, expectedVersion: number) {
  const row = await trx
    .selectFrom('reservations')
    .where('id', '=', reservationId)
    .selectAll()
    .forUpdate()
    .executeTakeFirst();
  if (!row || row.version !== expectedVersion) return null;
  return row;
}

/** Records that a lifecycle workflow has looked at the reservation (the sweeper's first filter). */
export async function markLifecycleStarted(db: Db | Trx, reservationId: string): Promise<void> {
  await db
    .updateTable('reservations')
    .set({ lifecycle_started_at: sql<Date>`compute_now()` })
    .where('id', '=', reservationId)
    .where('lifecycle_started_at', 'is', null)
    .execute();
}

/**
 * Bumps the version and `updated_at` with the given changes, in one statement; the caller holds the
 * row lock. Answers the new version and the lease deadline it left.
 */
export async function updateReservation(
  trx: Trx,
  reservationId: string,
  changes: {
    state?: ReservationState;
    conditions?: Condition[];
    bindAttempts?: number;
    bindDeadline?: Date | null;
    endReason?: string;
    /** Ends the window at compute_now() when it reaches later. */
    endWindowNow?: boolean;
    leaseFromNow?: boolean;
    /** Restarts the pending clock (`pending_since` = compute_now()). */
    pendingSinceNow?: boolean;
  },
): Promise<{ version: number; leaseExpiresAt: Date | null }> {
  let update = trx
    .updateTable('reservations')
    .set({ version: sql<number>`version + 1`, updated_at: sql<Date>`compute_now()` });
  if (changes.state) update = update.set({ state: changes.state });
  if (changes.conditions) update = update.set({ conditions: JSON.stringify(changes.conditions) });
  if (changes.bindAttempts !== undefined) update = update.set({ bind_attempts: changes.bindAttempts });
  if (changes.bindDeadline !== undefined) update = update.set({ bind_deadline: changes.bindDeadline });
  if (changes.endReason) update = update.set({ end_reason: changes.endReason });
  if (changes.endWindowNow) {
    update = update.set({
      during: sql<string>`CASE WHEN during IS NULL OR upper(during) <= compute_now() THEN during
        WHEN lower(during) >= compute_now() THEN during
        ELSE tstzrange(lower(during), compute_now(), '[)') END`,
    });
  }
  if (changes.leaseFromNow) {
    update = update.set({
      lease_expires_at: sql<Date>`compute_now() + make_interval(secs => lease_seconds)`,
    });
  }
  if (changes.pendingSinceNow) update = update.set({ pending_since: sql<Date>`compute_now()` });
  const row = await update
    .where('id', '=', reservationId)
    .returning(['version', 'lease_expires_at'])
    .executeTakeFirstOrThrow();
  return { version: row.version, leaseExpiresAt: row.lease_expires_at };
}

/**
 * The oldest `limit` live reservations (past their draft, not terminal) created more than
 * `graceMs` before compute_now(): the orphan sweep's candidates, with whether a lifecycle ever
 * looked at them. Read-only.
 */
export async function findSweepCandidates(db: Db, input: { graceMs: number; limit: number }) {
  return db
    .selectFrom('reservations')
    .where('state', 'in', liveStates)
    .where(sql<boolean>`created_at < compute_now() - make_interval(secs => ${input.graceMs / 1000})`)
    .select(['id', 'tenant_id', 'pool_id', 'state', 'lifecycle_started_at'])
    .orderBy('created_at')
    .limit(input.limit)
    .execute();
}
