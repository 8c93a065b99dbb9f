import { sql, type Transaction } from 'kysely';
import type { AdmissionCaches } from '../../core/admission-caches.ts';
import type { Database, Db } from '../../core/database.ts';
import {
  type BookedMember,
  bookingRepairFailedReason,
  memberTrouble,
  type RepairMoment,
  type RepairMove,
  type RepairOutcome,
} from '../../domain/booking-repair.ts';
import { newId } from '../../domain/ids.ts';
import type { Condition } from '../../domain/reservation-lifecycle.ts';
import { truncateAllocationBookings } from '../allocations/bookings.ts';
import { findAndBook, placementRequestOf } from '../allocations/placement.ts';
import { finishDrains } from '../nodes/drains.ts';
import { updateReservation } from './lifecycle.ts';
import { recordReservationEvent } from './lifecycle-events.ts';
import { endCurrentAllocations } from './lifecycle-release.ts';
import { lockReservationForPlacement } from './reservations.ts';
import { parseStoredRequest } from './stored.ts';

type Trx = Transaction<Database>;

interface MemberRow {
  id: string;
  node_id: string;
  name: string;
  gang_index: number;
  member_attempt: number;
  start: Date;
  end: Date;
  provision_state: string;
  cordoned: boolean;
  draining: boolean;
  maintenance: boolean;
  connectivity: string;
  no_schedule: string | null;
  unhealthy_atoms: string[] | null;
  device_ids: string[] | null;
  labels: Record<string, string> | null;
}

/**
 * The current booked members (allocations) of a reservation with what BookingRepair checks of
 * their nodes and atoms: scheduling flags, connectivity, a NoSchedule condition, booked atoms that
 * are unhealthy or gone, and the node's labels (a gang's topology value). Read-only.
 */
export async function readBookedMembers(db: Db | Trx, reservationId: string): Promise<BookedMember[]> {
  const { rows } = await sql<MemberRow>`
    SELECT a.id, a.node_id, n.name, a.gang_index, a.member_attempt, lower(a.during) AS start, upper(a.during) AS "end",
           n.provision_state, n.cordoned, n.draining, n.maintenance, n.connectivity,
           (SELECT c.type FROM node_conditions c WHERE c.node_id = n.id AND c.effect = 'NoSchedule'
             ORDER BY c.type LIMIT 1) AS no_schedule,
           (SELECT array_agg(d.stable_id ORDER BY d.stable_id) FROM device_bookings b JOIN devices d ON d.id = b.device_id
             WHERE b.allocation_id = a.id AND (d.health <> 'healthy' OR d.removed_at IS NOT NULL OR NOT d.bookable)) AS unhealthy_atoms,
           (SELECT array_agg(b.device_id ORDER BY b.device_id) FROM device_bookings b WHERE b.allocation_id = a.id) AS device_ids,
           (SELECT json_object_agg(l.key, l.value) FROM node_labels l WHERE l.node_id = n.id) AS labels
    FROM allocations a JOIN nodes n ON n.id = a.node_id
    WHERE a.reservation_id = ${reservationId} AND a.superseded_at IS NULL
    ORDER BY a.gang_index, a.id`.execute(db);
  return rows.map((r) => ({
    allocationId: r.id,
    nodeId: r.node_id,
    nodeName: r.name,
    gangIndex: r.gang_index,
    memberAttempt: r.member_attempt,
    deviceIds: r.device_ids ?? [],
    start: new Date(r.start).getTime(),
    end: new Date(r.end).getTime(),
    provisionState: r.provision_state,
    cordoned: r.cordoned,
    draining: r.draining,
    maintenance: r.maintenance,
    connectivity: r.connectivity,
    noSchedule: r.no_schedule,
    unhealthyAtoms: r.unhealthy_atoms ?? [],
    labels: r.labels ?? {},
  }));
}

class RepairNoFit extends Error {
  constructor(readonly summary: string) {
    super(summary);
  }
}

/**
 * BookingRepair of one `placed` reservation at `moment`, in the caller's transaction (run it
 * through withPlacementTransaction, which retries a lost placement race). Every booked member is
 * checked (memberTrouble); the bad ones are re-placed all or nothing under a savepoint: each old
 * allocation's bookings deleted and the allocation superseded, a new one booked over the same
 * window through the placer and the EXCLUDE constraint, on a node no other member holds and, for
 * a gang with a topologyKey, with the good members' value of that label. Moved: event
 * `reservation.repaired` with every move and a `reservation_repairs` row. No fit: nothing moves;
 * before the start the reservation keeps its bookings and carries `Unschedulable`/
 * `BookingRepairFailed` with the placer's summary; at the start it goes back to `pending` (its
 * bookings released, `reservation.pending` written) to be placed again like any other. A healthy
 * reservation loses a BookingRepairFailed condition left from before. Idempotent: a reservation no
 * longer `placed` changes nothing (`skipped`); a repeat after a move finds healthy members.
 */
export async function repairReservationBookings(
  trx: Trx,
  input: { reservationId: string; moment: RepairMoment; workflowId?: string; caches?: AdmissionCaches },
): Promise<RepairOutcome> {
  const row = await lockReservationForPlacement(trx, input.reservationId);
  if (row?.state !== 'placed') return { outcome: 'skipped', state: row?.state ?? null };
  const conditions = (row.conditions ?? []) as Condition[];
  const others = conditions.filter((c) => c.reason !== bookingRepairFailedReason);
  const members = await readBookedMembers(trx, row.id);
  const bad = members.flatMap((m) => {
    const reason = memberTrouble(m);
    return reason ? [{ member: m, reason }] : [];
  });
  if (bad.length === 0) {
    if (others.length !== conditions.length) await updateReservation(trx, row.id, { conditions: others });
    return { outcome: 'healthy', members: members.length };
  }
  const request = parseStoredRequest(row.id, row.request);
  const topologyKey = request.gang?.topologyKey;
  const good = members.filter((m) => !bad.some((b) => b.member.allocationId === m.allocationId));
  // A gang stays on the value it was placed on (kept on the reservation), else its good members' value.
  let topologyValue = topologyKey
    ? (row.gang_topology_value ?? good.map((m) => m.labels[topologyKey]).find((v) => v !== undefined))
    : undefined;
  const held = new Set(good.map((m) => m.nodeId));
  const moves: RepairMove[] = [];
  await sql`SAVEPOINT booking_repair`.execute(trx);
  try {
    for (const { member, reason } of bad) {
      await truncateAllocationBookings(trx, member.allocationId);
      await trx
        .updateTable('allocations')
        .set({
          state: 'released',
          released_at: sql<Date>`compute_now()`,
          superseded_at: sql<Date>`compute_now()`,
          updated_at: sql<Date>`compute_now()`,
        })
        .where('id', '=', member.allocationId)
        .execute();
      const base = placementRequestOf(request);
      const placement =
        topologyKey && topologyValue !== undefined
          ? {
              ...base,
              selector: {
                ...base.selector,
                nodeLabels: { ...base.selector?.nodeLabels, [topologyKey]: topologyValue },
              },
            }
          : base;
      const allocationId = newId('alloc');
      const result = await findAndBook(trx, {
        poolId: row.pool_id,
        request: placement,
        window: { start: member.start, end: member.end },
        durationMs: member.end - member.start,
        reservationId: row.id,
        excludeNodeIds: [...held],
        allocationId,
        ...(input.caches ? { caches: input.caches } : {}),
      });
      if (!result.placed) throw new RepairNoFit(result.message);
      // The new allocation is the same member: its number and its re-placement count carry over.
      await trx
        .updateTable('allocations')
        .set({ gang_index: member.gangIndex, member_attempt: member.memberAttempt ?? 0 })
        .where('id', '=', allocationId)
        .execute();
      held.add(result.fit.nodeId);
      if (topologyKey && topologyValue === undefined) {
        const labels = await trx
          .selectFrom('node_labels')
          .where('node_id', '=', result.fit.nodeId)
          .where('key', '=', topologyKey)
          .select('value')
          .executeTakeFirst();
        topologyValue = labels?.value;
      }
      moves.push({
        gangIndex: member.gangIndex,
        reason,
        fromAllocationId: member.allocationId,
        fromNodeId: member.nodeId,
        fromNodeName: member.nodeName,
        fromDeviceIds: member.deviceIds,
        toAllocationId: allocationId,
        toNodeId: result.fit.nodeId,
        toNodeName: result.fit.nodeName,
        toDeviceIds: result.fit.deviceIds,
      });
    }
  } catch (error) {
    if (!(error instanceof RepairNoFit)) throw error;
    await sql`ROLLBACK TO SAVEPOINT booking_repair`.execute(trx);
    return recordFailure(trx, row, { ...input, others, summary: error.summary, bad });
  }
  await sql`RELEASE SAVEPOINT booking_repair`.execute(trx);
  // A booking moved off a draining node may have been the last thing its drain waited for.
  await finishDrains(
    trx,
    moves.map((m) => m.fromNodeId),
  );
  await updateReservation(trx, row.id, { conditions: others });
  await recordReservationEvent(trx, row, 'reservation.repaired', 'placed', { moment: input.moment, moves });
  await trx
    .insertInto('reservation_repairs')
    .values({
      reservation_id: row.id,
      moment: input.moment,
      outcome: 'repaired',
      moves: JSON.stringify(moves),
      message: null,
      workflow_id: input.workflowId ?? null,
    })
    .execute();
  return { outcome: 'repaired', moves };
}

/** The no-fit half of a repair: the condition (and, at the start, back to pending) and its record. */
async function recordFailure(
  trx: Trx,
  row: { id: string; tenant_id: string; pool_id: string },
  input: {
    moment: RepairMoment;
    workflowId?: string;
    others: Condition[];
    summary: string;
    bad: Array<{ member: BookedMember; reason: string }>;
  },
): Promise<RepairOutcome> {
  const bad = input.bad.map(({ member, reason }) => ({
    allocationId: member.allocationId,
    nodeId: member.nodeId,
    reason,
  }));
  const which = input.bad.map(({ member, reason }) => `${member.nodeName} (${reason})`).join(', ');
  const message = `BookingRepair found no place for the booking on ${which}: ${input.summary}`;
  const condition: Condition = {
    type: 'Unschedulable',
    reason: bookingRepairFailedReason,
    message,
    since: (await sql<{ now: Date }>`SELECT compute_now() AS now`.execute(trx)).rows[0]!.now.getTime(),
  };
  const others = input.others.filter((c) => c.type !== 'Unschedulable');
  let state: 'placed' | 'pending' = 'placed';
  if (input.moment === 'start') {
    // At the start a broken booking cannot bind: back to pending, placed again like any other.
    const released = await endCurrentAllocations(trx, row.id, 'released');
    await updateReservation(trx, row.id, {
      state: 'pending',
      conditions: [...others, condition],
      pendingSinceNow: true,
    });
    await recordReservationEvent(trx, row, 'reservation.pending', 'pending', {
      reason: bookingRepairFailedReason,
      message,
      releasedAllocations: released.map((a) => a.id),
    });
    state = 'pending';
  } else {
    await updateReservation(trx, row.id, { conditions: [...others, condition] });
  }
  // Its own event, so a subscriber hears of the start at risk (the summary says why nothing fits).
  await recordReservationEvent(trx, row, 'reservation.repair-failed', state, {
    moment: input.moment,
    bad,
    message,
    summary: input.summary,
  });
  await trx
    .insertInto('reservation_repairs')
    .values({
      reservation_id: row.id,
      moment: input.moment,
      outcome: 'failed',
      moves: JSON.stringify(bad),
      message,
      workflow_id: input.workflowId ?? null,
    })
    .execute();
  return { outcome: 'failed', message, bad, state };
}

/** One recorded repair, as `reservations.get` shows it. */
export interface RepairRecord {
  at: number;
  moment: RepairMoment;
  outcome: 'repaired' | 'failed';
  /** Repaired: what moved from where to where. */
  moves: RepairMove[];
  /** Failed: the bad members nothing moved (the placer's summary is `message`). */
  bad: Array<{ allocationId: string; nodeId: string; reason: string }>;
  message: string | null;
  workflowId: string | null;
}

/** A stored repair row as the views read it (`created_at` in epoch ms). */
export interface StoredRepair {
  created_at: number | string | Date;
  moment: RepairMoment;
  outcome: 'repaired' | 'failed';
  moves: unknown;
  message: string | null;
  workflow_id: string | null;
}

/** One stored repair row as `reservations.get` shows it. */
export function repairRecordOf(r: StoredRepair): RepairRecord {
  return {
    at: r.created_at instanceof Date ? r.created_at.getTime() : Number(r.created_at),
    moment: r.moment,
    outcome: r.outcome,
    moves: r.outcome === 'repaired' ? (r.moves as RepairMove[]) : [],
    bad: r.outcome === 'failed' ? (r.moves as RepairRecord['bad']) : [],
    message: r.message,
    workflowId: r.workflow_id,
  };
}
