import { sql, type Transaction } from 'kysely';
import type { Database } from '../../core/database.ts';
import { ComputeError } from '../../domain/errors.ts';
import { truncateAllocationBookings } from '../allocations/bookings.ts';
import { bookGangMember } from '../allocations/gang-placement.ts';
import { startBindingAllocations } from '../allocations/lifecycle.ts';
import { placementRequestOf } from '../allocations/placement.ts';
import { updateReservation } from './lifecycle.ts';
import { recordReservationEvent } from './lifecycle-events.ts';
import { assignReservationDevices, changeNodeDeviceAssignments } from './lifecycle-nodespec.ts';
import { parseStoredRequest } from './stored.ts';

type Trx = Transaction<Database>;

/**
 * Thrown inside the replacement's transaction when a member finds no node left: the caller rolls
 * the transaction back (every member keeps its booking) and fails the whole binding attempt.
 */
export class NoNodeLeft extends ComputeError {
  constructor(message: string) {
    super('CAPACITY_UNAVAILABLE', message);
  }
}

/** One member moved from one node to another. */
export interface MemberMove {
  gangIndex: number;
  fromAllocationId: string;
  fromNodeId: string;
  toAllocationId: string;
  toNodeId: string;
  memberAttempt: number;
}

/**
 * Re-places the gang members `allocationIds` of a `binding` reservation (locked by the caller) on
 * their own, in the caller's transaction, all of them or none: each one not bound is ended
 * (bookings truncated at compute_now(), `failed`, superseded, withdrawn from its node's NodeSpec)
 * and booked again over [compute_now(), end) on another node of the gang's topology value that
 * no current member uses, as member `gangIndex` with `member_attempt` + 1; the others keep their
 * bookings. The new members start binding (NodeSpec assignments written), the bind deadline moves
 * to `bindDeadline`, and `reservation.member-replaced` names every move. Idempotent: members
 * already bound or gone are skipped, and with none left nothing changes (an empty answer).
 * Throws NoNodeLeft (roll back) when a member finds no node; PlacementContention on a lost race.
 */
export async function replaceGangMembers(
  trx: Trx,
  row: {
    id: string;
    tenant_id: string;
    pool_id: string;
    request: unknown;
    binding_kind: string;
    gang_topology_value: string | null;
  },
  input: { allocationIds: readonly string[]; reason: string; bindDeadline: number },
): Promise<MemberMove[]> {
  const request = parseStoredRequest(row.id, row.request);
  if (!request.gang) return [];
  const current = await trx
    .selectFrom('allocations')
    .where('reservation_id', '=', row.id)
    .where('superseded_at', 'is', null)
    .select([
      'id',
      'node_id',
      'state',
      'gang_index',
      'member_attempt',
      sql<Date>`greatest(lower(during), compute_now())`.as('from'),
      sql<Date>`upper(during)`.as('until'),
    ])
    .orderBy('gang_index')
    .orderBy('id')
    .forUpdate()
    .execute();
  const failing = current.filter((a) => input.allocationIds.includes(a.id) && a.state !== 'bound');
  if (failing.length === 0) return [];
  const exclude = current.map((a) => a.node_id);
  const moves: MemberMove[] = [];
  for (const member of failing) {
    await truncateAllocationBookings(trx, member.id);
    await trx
      .updateTable('allocations')
      .set({
        state: 'failed',
        released_at: sql<Date>`COALESCE(released_at, compute_now())`,
        superseded_at: sql<Date>`compute_now()`,
        updated_at: sql<Date>`compute_now()`,
      })
      .where('id', '=', member.id)
      .execute();
    await changeNodeDeviceAssignments(trx, member.node_id, { remove: [member.id] });
    const placed = await bookGangMember(trx, {
      poolId: row.pool_id,
      reservationId: row.id,
      request: placementRequestOf(request),
      gang: request.gang,
      topologyValue: row.gang_topology_value,
      window: { start: member.from.getTime(), end: member.until.getTime() },
      excludeNodeIds: exclude,
      gangIndex: member.gang_index,
      memberAttempt: member.member_attempt + 1,
    });
    if (!placed.placed) throw new NoNodeLeft(placed.message);
    exclude.push(placed.fit.nodeId);
    moves.push({
      gangIndex: member.gang_index,
      fromAllocationId: member.id,
      fromNodeId: member.node_id,
      toAllocationId: placed.allocationId,
      toNodeId: placed.fit.nodeId,
      memberAttempt: member.member_attempt + 1,
    });
  }
  await startBindingAllocations(trx, row.id);
  await assignReservationDevices(trx, row.id, row.binding_kind === 'kubernetes' ? 'kubernetes' : 'hold');
  await updateReservation(trx, row.id, { bindDeadline: new Date(input.bindDeadline) });
  await recordReservationEvent(trx, row, 'reservation.member-replaced', 'binding', {
    reason: input.reason,
    moves,
    bindDeadline: input.bindDeadline,
  });
  return moves;
}
