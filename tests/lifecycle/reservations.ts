import { sql } from 'kysely';
import { insertDeviceBookings } from '../../db/allocations/bookings.ts';
import type { RegisteredNode } from '../../db/nodes/fleet.ts';
import { newId } from '../../domain/ids.ts';
import type { NormalizedRequest } from '../../domain/reservation-request.ts';
import type { LifecycleHarness } from './harness.ts';

/** A stored request in admission's normalized form. */
export function normalizedRequest(poolId: string, gpus: number, durationMs: number): NormalizedRequest {
  return {
    poolId,
    devices: [{ class: 'gpu', count: gpus, topology: 'any' }],
    duration: `${durationMs}ms`,
    durationMs,
    binding: 'hold',
  };
}

/** The columns every test reservation shares: the harness's tenant and pool, a request for `gpus`. */
function reservationRow(h: LifecycleHarness, id: string, gpus: number, durationMs: number) {
  return {
    id,
    tenant_id: h.tenantId,
    pool_id: h.poolId,
    owner_identity_id: 'idn_test',
    idempotency_key: id,
    request: JSON.stringify(normalizedRequest(h.poolId, gpus, durationMs)),
    request_hash: 'test',
    duration_ms: durationMs,
  };
}

/**
 * A reservation as admission leaves it after its second transaction: placed on `node` (all its
 * GPUs) for `[start, start + durationMs)`, its quota charged, its `reservation.placed` event written.
 */
export async function insertPlacedReservation(
  h: LifecycleHarness,
  input: { node?: RegisteredNode; startInMs?: number; durationMs?: number; leaseSeconds?: number } = {},
): Promise<{ id: string; allocationId: string }> {
  const node = input.node ?? h.nodes[0]!;
  const id = newId('rsv');
  const allocationId = newId('alloc');
  await h.db.transaction().execute(async (trx) => {
    const { rows } = await sql<{ now: Date }>`SELECT compute_now() AS now`.execute(trx);
    const start = new Date(rows[0]!.now.getTime() + (input.startInMs ?? 0));
    const end = new Date(start.getTime() + (input.durationMs ?? 3_600_000));
    const during = `[${start.toISOString()},${end.toISOString()})`;
    await trx
      .insertInto('reservations')
      .values({
        ...reservationRow(h, id, node.deviceIds.length, end.getTime() - start.getTime()),
        state: 'placed',
        during,
        lease_seconds: input.leaseSeconds ?? null,
        lease_expires_at: input.leaseSeconds
          ? sql<Date>`compute_now() + make_interval(secs => ${input.leaseSeconds})`
          : null,
      })
      .execute();
    await trx
      .insertInto('allocations')
      .values({
        id: allocationId,
        reservation_id: id,
        node_id: node.id,
        state: 'planned',
        during,
        resources: '{}',
      })
      .execute();
    await insertDeviceBookings(
      trx,
      node.deviceIds.map((deviceId) => ({ deviceId, allocationId, start, end })),
    );
    await trx
      .insertInto('quota_charges')
      .values({
        reservation_id: id,
        tenant_id: h.tenantId,
        pool_id: h.poolId,
        resource: 'gpu',
        amount: node.deviceIds.length,
      })
      .execute();
    await trx
      .updateTable('quotas')
      .set({ used: sql<string>`used + ${node.deviceIds.length}` })
      .where('tenant_id', '=', h.tenantId)
      .where('pool_id', '=', h.poolId)
      .where('resource', '=', 'gpu')
      .execute();
  });
  return { id, allocationId };
}

/** A reservation without a placement: `pending` (charged, Unschedulable) or `awaiting-confirmation`. */
export async function insertUnplacedReservation(
  h: LifecycleHarness,
  input: {
    state: 'pending' | 'awaiting-confirmation';
    confirmationExpiresInMs?: number;
    durationMs?: number;
    gpus?: number;
  },
): Promise<string> {
  const id = newId('rsv');
  await h.db
    .insertInto('reservations')
    .values({
      ...reservationRow(h, id, input.gpus ?? 2, input.durationMs ?? 3_600_000),
      state: input.state,
      pending_since: input.state === 'pending' ? sql<Date>`compute_now()` : null,
      conditions:
        input.state === 'pending'
          ? JSON.stringify([{ type: 'Unschedulable', reason: 'NoFit', message: 'nothing fits' }])
          : JSON.stringify([{ type: 'ConfirmationRequired', reason: 'cnf_test', message: 'waiting' }]),
      confirmation_id: input.state === 'awaiting-confirmation' ? 'cnf_test' : null,
      confirmation_expires_at:
        input.state === 'awaiting-confirmation'
          ? sql<Date>`compute_now() + make_interval(secs => ${(input.confirmationExpiresInMs ?? 60_000) / 1000})`
          : null,
    })
    .execute();
  return id;
}
