import type { Transaction } from 'kysely';
import type { Database } from '../../core/database.ts';
import { newId } from '../../domain/ids.ts';
import type { NormalizedRequest } from '../../domain/reservation-request.ts';

/**
 * A placed reservation with one allocation on `nodeId`, for tests that exercise the booking layer
 * below admission. Returns the allocation id.
 */
export async function insertBareAllocation(
  trx: Transaction<Database>,
  input: { poolId: string; nodeId: string; start: Date; end: Date; tenantId?: string },
): Promise<string> {
  const reservationId = newId('rsv');
  const allocationId = newId('alloc');
  const range = `[${input.start.toISOString()},${input.end.toISOString()})`;
  await trx
    .insertInto('reservations')
    .values({
      id: reservationId,
      tenant_id: input.tenantId ?? 'tnt_test',
      pool_id: input.poolId,
      owner_identity_id: 'idn_test',
      idempotency_key: reservationId,
      request: JSON.stringify({
        poolId: input.poolId,
        devices: [{ class: 'gpu', count: 1, topology: 'any' }],
        duration: `${input.end.getTime() - input.start.getTime()}ms`,
        durationMs: input.end.getTime() - input.start.getTime(),
        binding: 'hold',
      } satisfies NormalizedRequest),
      request_hash: 'test',
      state: 'placed',
      duration_ms: input.end.getTime() - input.start.getTime(),
      during: range,
    })
    .execute();
  await trx
    .insertInto('allocations')
    .values({
      id: allocationId,
      reservation_id: reservationId,
      node_id: input.nodeId,
      state: 'planned',
      during: range,
      resources: '{}',
    })
    .execute();
  return allocationId;
}
