import { sql, type Transaction } from 'kysely';
import type { Database } from '../../core/database.ts';
import { truncateAllocationBookings } from '../allocations/bookings.ts';
import { finishDrains } from '../nodes/drains.ts';
import { withdrawNodeDeviceAssignments } from './lifecycle-nodespec.ts';

type Trx = Transaction<Database>;

/**
 * Ends the current placement of a reservation at compute_now(), in the caller's transaction: every
 * allocation the control plane has not released yet has its bookings truncated (future ones
 * deleted), is marked `state` with `released_at` and `superseded_at` (no longer the current
 * placement), and leaves its node's NodeSpec; a draining node left with nothing is drained
 * (`finishDrains`). Idempotent: a
 * second call finds no current allocation. Answers the allocations it ended.
 */
export async function endCurrentAllocations(
  trx: Trx,
  reservationId: string,
  state: 'released' | 'failed',
): Promise<Array<{ id: string; node_id: string }>> {
  const allocations = await trx
    .selectFrom('allocations')
    .where('reservation_id', '=', reservationId)
    .where('superseded_at', 'is', null)
    .select(['id', 'node_id'])
    .orderBy('id')
    .forUpdate()
    .execute();
  for (const allocation of allocations) await truncateAllocationBookings(trx, allocation.id);
  if (allocations.length > 0) {
    await trx
      .updateTable('allocations')
      .set({
        state,
        released_at: sql<Date>`COALESCE(released_at, compute_now())`,
        superseded_at: sql<Date>`compute_now()`,
        updated_at: sql<Date>`compute_now()`,
      })
      .where(
        'id',
        'in',
        allocations.map((a) => a.id),
      )
      .execute();
  }
  await finishDrains(trx, await withdrawNodeDeviceAssignments(trx, allocations));
  return allocations;
}

/**
 * Gives back every quota charge of a reservation not refunded yet, once: the charge rows are marked
 * refunded under their row locks, and the tenant's `used` goes down by exactly what was charged.
 */
export async function refundReservationQuota(trx: Trx, reservationId: string): Promise<void> {
  const charges = await trx
    .updateTable('quota_charges')
    .set({ refunded_at: sql<Date>`compute_now()` })
    .where('reservation_id', '=', reservationId)
    .where('refunded_at', 'is', null)
    .returning(['tenant_id', 'pool_id', 'resource', 'amount'])
    .execute();
  const ordered = [...charges].sort((a, b) => (a.pool_id + a.resource).localeCompare(b.pool_id + b.resource));
  for (const charge of ordered) {
    await trx
      .updateTable('quotas')
      .set({ used: sql<string>`greatest(used - ${charge.amount}::numeric, 0)` })
      .where('tenant_id', '=', charge.tenant_id)
      .where('pool_id', '=', charge.pool_id)
      .where('resource', '=', charge.resource)
      .execute();
  }
}
