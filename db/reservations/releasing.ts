import { sql, type Transaction } from 'kysely';
import type { Database } from '../../core/database.ts';
import { devicesHeldCondition, type ForcedReleaseReason } from '../../domain/kubernetes-release.ts';
import type { Condition } from '../../domain/reservation-lifecycle.ts';
import { lockDevices } from '../allocations/bookings.ts';
import { insertOutboxEvent } from '../events/outbox.ts';
import { updateReservation } from './lifecycle.ts';
import { recordReservationEvent, reservationStateEvent } from './lifecycle-events.ts';
import { withdrawNodeDeviceAssignments } from './lifecycle-nodespec.ts';
import { endCurrentAllocations, refundReservationQuota } from './lifecycle-release.ts';
import { callOffPreemptionsBy } from './preemption-call-off.ts';

type Trx = Transaction<Database>;

/** The reservation columns the release of a kubernetes binding reads (its locked row). */
export interface ReleasingReservationRow {
  id: string;
  tenant_id: string;
  pool_id: string;
  state: string;
  binding_kind: string;
  spot: boolean;
  end_reason: string | null;
  conditions: unknown;
}

const withoutDevicesHeld = (conditions: unknown): Condition[] =>
  ((conditions ?? []) as Condition[]).filter((c) => c.type !== 'DevicesHeld');

/**
 * Begins the release of an active `kubernetes`-bound reservation, in the caller's transaction
 * (the reservation row locked): its bound allocations become `releasing` and leave their nodes'
 * NodeSpecs (bcd stops advertising the GPUs), their bookings and quota stay, and the reservation
 * becomes `releasing` with `end_reason` = `reason` and the `DevicesHeld`/`PodsHoldDevices`
 * condition (since compute_now()); `reservation.releasing` is written. The node reports each
 * allocation released once no pod holds its GPUs (judgeAllocationReport), and the lifecycle
 * finishes the release (finishHeldRelease). Answers null, changing nothing, for any other
 * reservation (another binding, not active, or preempted): the caller releases it at once. Idempotent: a
 * `releasing` reservation is not active, so a second call answers null.
 */
export async function beginKubernetesRelease(
  trx: Trx,
  row: ReleasingReservationRow,
  reason: string,
): Promise<{ nodeIds: string[] } | null> {
  if (row.binding_kind !== 'kubernetes' || row.state !== 'active') return null;
  // A preempted spot reservation's GPUs are booked by its preemptor from its deadline: not held.
  if (reason === 'preempted') return null;
  const allocations = await trx
    .selectFrom('allocations')
    .where('reservation_id', '=', row.id)
    .where('superseded_at', 'is', null)
    .where('state', '=', 'bound')
    .select(['id', 'node_id'])
    .orderBy('id')
    .forUpdate()
    .execute();
  if (allocations.length === 0) return null;
  await trx
    .updateTable('allocations')
    .set({ state: 'releasing', updated_at: sql<Date>`compute_now()` })
    .where(
      'id',
      'in',
      allocations.map((a) => a.id),
    )
    .execute();
  const nodeIds = await withdrawNodeDeviceAssignments(trx, allocations);
  const { rows } = await sql<{ now: Date }>`SELECT compute_now() AS now`.execute(trx);
  const since = new Date(rows[0]!.now).getTime();
  await updateReservation(trx, row.id, {
    state: 'releasing',
    endReason: reason,
    bindDeadline: null,
    conditions: [...withoutDevicesHeld(row.conditions), devicesHeldCondition(nodeIds, since)],
  });
  await sql`DELETE FROM extend_holds WHERE reservation_id = ${row.id}`.execute(trx);
  await insertOutboxEvent(
    trx,
    reservationStateEvent(row, 'reservation.releasing', 'releasing', {
      reason,
      nodeIds,
      allocationIds: allocations.map((a) => a.id),
    }),
  );
  return { nodeIds };
}

/**
 * Carries the bookings of a held release: every `releasing` allocation of the reservation has
 * its device and host-resource bookings' upper bound moved to `until` (never earlier), under the
 * per-device locks taken in their fixed order. Billing does not follow (it stops at the
 * allocation's own end). 'refused' when another booking already takes a device or the host's
 * room in the carried span: nothing is carried then. Idempotent: carrying to the same `until`
 * again changes nothing.
 */
export async function carryHeldRelease(
  trx: Trx,
  reservationId: string,
  until: Date,
): Promise<'carried' | 'refused'> {
  const allocations = await trx
    .selectFrom('allocations')
    .where('reservation_id', '=', reservationId)
    .where('superseded_at', 'is', null)
    .where('state', '=', 'releasing')
    .select('id')
    .orderBy('id')
    .forUpdate()
    .execute();
  const ids = allocations.map((a) => a.id);
  if (ids.length === 0) return 'carried';
  const devices = await trx
    .selectFrom('device_bookings')
    .where('allocation_id', 'in', ids)
    .select('device_id')
    .execute();
  await lockDevices(
    trx,
    devices.map((d) => d.device_id),
  );
  const to = until.toISOString();
  // The exclusion constraint and the host-room guard referee the carry; a refusal is rolled back
  // to here so the transaction can still force the release.
  await sql`SAVEPOINT carry_release`.execute(trx);
  try {
    for (const table of [sql.raw('device_bookings'), sql.raw('scalar_bookings')]) {
      await sql`UPDATE ${table} SET during = tstzrange(lower(during), ${to}::timestamptz, '[)')
        WHERE allocation_id = ANY(${ids}::text[]) AND upper(during) < ${to}::timestamptz
          AND lower(during) < ${to}::timestamptz`.execute(trx);
    }
  } catch (error) {
    const code = (error as { code?: string }).code;
    if (code !== '23P01' && code !== 'BC001') throw error;
    await sql`ROLLBACK TO SAVEPOINT carry_release`.execute(trx);
    return 'refused';
  }
  await sql`RELEASE SAVEPOINT carry_release`.execute(trx);
  return 'carried';
}

/**
 * Finishes the release of a `releasing` reservation, in the caller's transaction (its row
 * locked): the current allocations end at compute_now() (bookings truncated, carried ones too;
 * `released_at` kept from the node's report, so billing stops there or at the allocation's own
 * end, whichever is first), quota is refunded, the preemptions it made are called off, the
 * `DevicesHeld` condition goes and the reservation is `released` with its `end_reason`. Forced
 * (`carry-limit`: 24 hours past the end; `carry-refused`: another booking took the carried span),
 * it also writes `reservation.release-forced` with the allocations still held. Idempotent through
 * the caller's state guard (a released reservation is not `releasing`).
 */
export async function finishHeldRelease(
  trx: Trx,
  row: ReleasingReservationRow,
  forced: ForcedReleaseReason | null,
): Promise<void> {
  const held = await trx
    .selectFrom('allocations')
    .where('reservation_id', '=', row.id)
    .where('superseded_at', 'is', null)
    .where('state', '=', 'releasing')
    .select([
      'id',
      'node_id',
      sql<Date | null>`(SELECT max(upper(b.during)) FROM device_bookings b
      WHERE b.allocation_id = allocations.id)`.as('booked_until'),
    ])
    .orderBy('id')
    .execute();
  await endCurrentAllocations(trx, row.id, 'released');
  await refundReservationQuota(trx, row.id);
  if (!row.spot) await callOffPreemptionsBy(trx, row.id);
  await updateReservation(trx, row.id, {
    state: 'released',
    endWindowNow: true,
    conditions: withoutDevicesHeld(row.conditions),
  });
  const reason = row.end_reason ?? 'release';
  await recordReservationEvent(trx, row, 'reservation.released', 'released', {
    reason,
    ...(forced ? { forced } : {}),
  });
  if (forced) {
    await recordReservationEvent(trx, row, 'reservation.release-forced', 'released', {
      reason: forced,
      allocationIds: held.map((a) => a.id),
      nodeIds: [...new Set(held.map((a) => a.node_id))].sort(),
      carriedUntil: Math.max(
        0,
        ...held.map((a) => (a.booked_until ? new Date(a.booked_until).getTime() : 0)),
      ),
    });
  }
}
