import { sql, type Transaction } from 'kysely';
import type { Database } from '../../core/database.ts';

type Trx = Transaction<Database>;

/**
 * The allocations of a reservation's current placement (those the control plane has not
 * superseded) as its lifecycle steps change them, in the caller's transaction.
 */

/** A binding attempt starts: the current placement's `planned` allocations become `binding`. Idempotent. */
export async function startBindingAllocations(trx: Trx, reservationId: string): Promise<void> {
  await trx
    .updateTable('allocations')
    .set({ state: 'binding', updated_at: sql<Date>`compute_now()` })
    .where('reservation_id', '=', reservationId)
    .where('superseded_at', 'is', null)
    .where('state', '=', 'planned')
    .execute();
}

/** The current placement's allocations, locked until the caller's transaction ends. */
export async function lockCurrentAllocations(trx: Trx, reservationId: string) {
  return trx
    .selectFrom('allocations')
    .where('reservation_id', '=', reservationId)
    .where('superseded_at', 'is', null)
    .select(['id', 'node_id', 'state', 'binding'])
    .forUpdate()
    .execute();
}
