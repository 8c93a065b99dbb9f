import { sql, type Transaction } from 'kysely';
import { type AdmissionCaches, createAdmissionCaches } from '../../core/admission-caches.ts';
import type { Database, Db, Reservation } from '../../core/database.ts';
import { type BatchRequest, planBatch } from '../../domain/batch-placer.ts';
import { newId } from '../../domain/ids.ts';
import type { PlacerNode } from '../../domain/placer.ts';
import { poolLeaseBatchSize, readPoolPolicy } from '../../domain/pool-policy.ts';
import type { PreemptionSummary } from '../../domain/preemption.ts';
import { isQueued } from '../../domain/reservation-lifecycle-conditions.ts';
import type { Condition } from '../../domain/reservation-lifecycle-types.ts';
import type { DeviceClass } from '../../domain/reservation-request.ts';
import { bookPlannedAllocations, type PlannedAllocation } from '../allocations/batch-bookings.ts';
import { batchCandidates } from '../allocations/batch-candidates.ts';
import { placementRequestOf, verification } from '../allocations/placement.ts';
import { notifyReservationsSettled } from '../notify-channels.ts';
import { preparedMarker } from '../pool.ts';
import { markBatchPlaced } from './batch-placed.ts';
import { placeLockedReservation } from './placement.ts';
import { parseStoredRequest } from './stored.ts';

type Trx = Transaction<Database>;

/**
 * The queue's predicate on the reservation row `alias`: pending, waiting for the pool-lease placer
 * (the predicate of the queue's index, reservations_queue_idx).
 */
const queuedRow = (alias: 'r' | 'q') =>
  sql`${sql.raw(alias)}.state = 'pending' AND ${sql.raw(alias)}.conditions @> '[{"type":"Queued"}]'`;
const queued = queuedRow('r');

/** A pool the pool-lease placers serve, with its batch size. */
export interface PoolToPlace {
  poolId: string;
  batchSize: number;
}

/**
 * The pools the pool-lease placers serve: those whose policy says `placer: 'pool-lease'`, and any
 * other unarchived pool that still has queued requests (one switched back to `inline` drains its
 * queue). Read-only.
 */
export async function poolsToPlace(db: Db): Promise<PoolToPlace[]> {
  const { rows } = await sql<{ id: string; policy: unknown }>`
    SELECT p.id, p.policy FROM pools p
    WHERE p.archived_at IS NULL
      AND (p.policy->>'placer' = 'pool-lease'
           OR EXISTS (SELECT 1 FROM reservations r WHERE r.pool_id = p.id AND ${queued}))
    ORDER BY p.id`.execute(db);
  return rows.map((row) => ({ poolId: row.id, batchSize: poolLeaseBatchSize(readPoolPolicy(row.policy)) }));
}

/** How many requests of a pool are queued now. Read-only. */
export async function countQueued(db: Db | Trx, poolId: string): Promise<number> {
  const { rows } = await sql<{ n: string }>`
    SELECT count(*) AS n FROM reservations r WHERE r.pool_id = ${poolId} AND ${queued}`.execute(db);
  return Number(rows[0]?.n ?? 0);
}

/** What one batch decided: each reservation placed or left `pending` (Unschedulable). */
export interface QueuedBatch {
  /** How many queued requests the batch took (at most the batch size). */
  taken: number;
  placed: Array<{ reservationId: string; tenantId: string; preemption?: PreemptionSummary }>;
  pending: Array<{ reservationId: string; tenantId: string }>;
}

/** Candidate reads per device class before a request that fits none goes to the inline placer. */
const candidateRounds = 2;

/**
 * One pool-lease batch, in the caller's transaction (run it through withPlacementTransaction,
 * which retries it whole when it lost a placement race), set-based:
 * 1. up to `batchSize` queued requests of the pool picked fair across tenants (round-robin by
 *    tenant, each tenant's oldest first) and locked in the same statement (one whose row something
 *    else holds, e.g. a cancel, is skipped);
 * 2. the pool's candidate nodes for the batch's window (batchCandidates: the warm nodes and a
 *    sample sized to the demand they cannot take, through the placer's node cache, only the nodes
 *    it lacks read; a larger sample once more when some request fits none), and every request
 *    planned in memory in the fair order (planBatch: the inline placer's best fit, each plan booked
 *    in memory before the next);
 * 3. the plans booked together in two statements (bookPlannedAllocations: the host rows and the
 *    per-device locks in the global order; then, under them, the room, the atoms' bookings and the
 *    node as the plan saw it re-checked and the plans it kept inserted through the EXCLUDE
 *    constraint and the scalar guard) and their reservations marked `placed` with their events,
 *    audit rows and waiters' notifications in one statement (markBatchPlaced);
 * 4. what that could not place — gangs, whole machines, a request that fit no candidate, a plan the
 *    re-check refused — goes through the inline placer's own code one by one
 *    (placeLockedReservation: the whole pool, spot preemption, and for a request that does not fit
 *    the `Unschedulable`/`NoFit` condition with its counter-offer and `reservation.pending`, once),
 *    and those ids are notified at commit for waiting creates;
 * 5. `fence` runs last in the same transaction (the lease's epoch check: it throws when the caller
 *    lost the lease, and the whole batch rolls back, its notifications with it).
 * Idempotent: a reservation no longer queued is not taken.
 */
export async function placeQueuedBatch(
  trx: Trx,
  input: {
    poolId: string;
    batchSize: number;
    caches?: AdmissionCaches;
    fence: (trx: Trx) => Promise<unknown>;
    /** The lease holder placing (named in the audit rows). */
    placer?: { holder: string; epoch: number };
    /**
     * Called once the batch will take no more lock a later batch could hold (its bookings made and
     * known to the placer's node cache; what is left: marking them placed, the fence and the
     * commit), with how many requests it took: from here a next batch may run beside it (it skips
     * this one's requests, plans around its bookings, and its fence waits for this one's commit).
     * Called again when the transaction is retried.
     */
    onBooked?: (taken: number) => void;
  },
): Promise<QueuedBatch> {
  // The queue is read through its own index (reservations_queue_idx: presorted for the tenants'
  // turns), then its rows are locked by primary key alone. No other predicate on `r`: with one,
  // a partial index over every live reservation (planned as empty on statistics taken while none
  // was live) could serve the lock step too, scanned whole for each queued row (75 ms a batch at
  // 5,000 live). A row that left the queue after the read but before its lock is returned as it
  // now is (the lock re-reads it) and dropped here.
  const { rows: locked } = await sql<Reservation & { now: Date }>`${sql.raw(preparedMarker)}
    WITH f AS MATERIALIZED (
      SELECT q.id, q.created_at,
             row_number() OVER (PARTITION BY q.tenant_id ORDER BY q.created_at, q.id) AS turn
      FROM reservations q WHERE q.pool_id = ${input.poolId} AND ${queuedRow('q')}
    )
    SELECT r.*, compute_now() AS now FROM f JOIN reservations r ON r.id = f.id
    WHERE f.turn <= ${input.batchSize}
    ORDER BY f.turn, f.created_at, f.id
    LIMIT ${input.batchSize}
    FOR UPDATE OF r SKIP LOCKED`.execute(trx);
  const rows = locked.filter((row) => isQueued(row.state, row.conditions as Condition[]));
  const batch: QueuedBatch = { taken: rows.length, placed: [], pending: [] };
  // The batch's own placements (booked together, marked placed together).
  const placedAt = new Map<string, { nodeId: string; start: number; end: number }>();
  if (rows.length > 0) {
    // The batch's own placements: every request the set-based path can place, by device class.
    const byClass = new Map<DeviceClass, BatchRequest[]>();
    for (const row of rows) {
      const request = parseStoredRequest(row.id, row.request);
      if (request.gang || request.binding === 'node') continue;
      const now = row.now.getTime();
      const start = Math.max(now, row.requested_start?.getTime() ?? now);
      const placement = placementRequestOf(request);
      const list = byClass.get(placement.deviceClass) ?? [];
      list.push({ id: row.id, request: placement, window: { start, end: start + Number(row.duration_ms) } });
      byClass.set(placement.deviceClass, list);
    }
    const caches = input.caches ?? createAdmissionCaches();
    const plans: PlannedAllocation[] = [];
    for (const [deviceClass, requests] of byClass) {
      const horizon = {
        start: Math.min(...requests.map((r) => r.window.start)),
        end: Math.max(...requests.map((r) => r.window.end)),
      };
      const nodes = new Map<string, PlacerNode>();
      const byRequest = new Map(requests.map((r) => [r.id, r.request]));
      let left = requests;
      for (let round = 0; round < candidateRounds && left.length > 0; round++) {
        const read = await batchCandidates(trx, {
          poolId: input.poolId,
          deviceClass,
          horizon,
          requests: left,
          round,
          excludeNodeIds: new Set(nodes.keys()),
          caches,
        });
        for (const node of read) nodes.set(node.id, node);
        const plan = planBatch([...nodes.values()], left);
        for (const p of plan.planned) {
          plans.push({
            allocationId: newId('alloc'),
            reservationId: p.id,
            nodeId: p.fit.nodeId,
            deviceIds: p.fit.deviceIds,
            resources: p.fit.resources,
            start: new Date(p.window.start),
            end: new Date(p.window.end),
            verify: verification(nodes.get(p.fit.nodeId)!, p.fit, byRequest.get(p.id)!),
          });
          placedAt.set(p.id, { nodeId: p.fit.nodeId, ...p.window });
        }
        const unplaced = new Set(plan.unplaced);
        left = left.filter((r) => unplaced.has(r.id));
      }
    }
    const stale = await bookPlannedAllocations(trx, plans);
    for (const id of stale) placedAt.delete(id);
    // The cache learns this batch's bookings (as the inline placer's do, whether or not the
    // transaction commits) and forgets the nodes a re-check found changed.
    for (const p of plans) {
      if (stale.has(p.reservationId)) caches.placerNodes.forget(input.poolId, p.verify.deviceClass, p.nodeId);
      else
        caches.placerNodes.recordBooking(input.poolId, p.verify.deviceClass, {
          nodeId: p.nodeId,
          deviceIds: p.deviceIds,
          window: { start: p.start.getTime(), end: p.end.getTime() },
          resources: p.resources,
        });
    }
    const byId = new Map(rows.map((row) => [row.id, row]));
    // With nothing left for the inline placer's code (which locks node by node), booked already.
    if (placedAt.size === rows.length) input.onBooked?.(rows.length);
    await markBatchPlaced(
      trx,
      [...placedAt].map(([id, at]) => ({ row: byId.get(id)!, ...at })),
      input.placer ?? null,
    );
    for (const row of rows) {
      if (placedAt.has(row.id)) {
        batch.placed.push({ reservationId: row.id, tenantId: row.tenant_id });
        continue;
      }
      // The inline placer's own code for the rest, one by one.
      const outcome = await placeLockedReservation(trx, row, row.now.getTime(), {
        // A retry (already Unschedulable) is not announced again, as inline retries are not.
        announcePending: !(row.conditions as Array<{ type: string }>).some((c) => c.type === 'Unschedulable'),
        ...(input.caches ? { caches: input.caches } : {}),
      });
      if (outcome.outcome === 'placed') {
        batch.placed.push({
          reservationId: row.id,
          tenantId: row.tenant_id,
          ...(outcome.preemption ? { preemption: outcome.preemption } : {}),
        });
      } else {
        batch.pending.push({ reservationId: row.id, tenantId: row.tenant_id });
      }
    }
  }
  if (placedAt.size !== rows.length) input.onBooked?.(rows.length);
  // The batch's own placements were notified with their marking; the rest are notified here.
  await notifyReservationsSettled(trx, [
    ...batch.placed.filter((p) => !placedAt.has(p.reservationId)).map((p) => p.reservationId),
    ...batch.pending.map((p) => p.reservationId),
  ]);
  await input.fence(trx);
  return batch;
}
