import { type RawBuilder, sql, type Transaction } from 'kysely';
import type { Database, Db } from '../core/database.ts';

type Trx = Transaction<Database>;

/** The channel a commit that queues a request for the pool-lease placer notifies (payload: pool id). */
export const poolQueueChannel = 'bc_pool_queue';

/**
 * The channel a pool-lease batch notifies at commit with the ids of the reservations it decided
 * (comma-separated): what wakes a `create` that waits on its operation.
 */
export const reservationsSettledChannel = 'bc_reservations_settled';

/**
 * Tells the pool placers, when the caller's transaction commits, that `poolId` has a queued
 * request. Nothing is sent if it rolls back, and PostgreSQL folds identical notifications of one
 * transaction into one. Only a hint: the placer's slow poll covers a lost one. Idempotent.
 */
export async function notifyPoolQueued(trx: Trx, poolId: string): Promise<void> {
  await sql`SELECT pg_notify(${poolQueueChannel}, ${poolId})`.execute(trx);
}

/** Per database handle and pool: whether a notification is in flight, and whether another is owed. */
const poolNotifiers = new WeakMap<object, Map<string, { again: boolean }>>();

/**
 * Tells the pool placers that `poolId` has a queued request the caller has already committed, in
 * a statement of its own, coalesced per pool: while one is in flight, later calls owe exactly one
 * more, sent when it is answered, so every commit is followed by a notification. For commits
 * that must not carry the NOTIFY themselves: PostgreSQL serializes the commits of notifying
 * transactions database-wide (each waits for the one before to flush its WAL), so a queueing
 * statement that notified made every tenant's queueing wait in one line. Never throws (a lost
 * one is covered by the placer's slow poll).
 */
export function notifyPoolQueuedAfterCommit(db: Db, poolId: string, onError: (error: unknown) => void): void {
  let pools = poolNotifiers.get(db);
  if (!pools) {
    pools = new Map();
    poolNotifiers.set(db, pools);
  }
  const inFlight = pools.get(poolId);
  if (inFlight) {
    inFlight.again = true;
    return;
  }
  const state = { again: false };
  pools.set(poolId, state);
  const send = (): void => {
    state.again = false;
    sql`SELECT pg_notify(${poolQueueChannel}, ${poolId})`
      .execute(db)
      .catch(onError)
      .finally(() => {
        if (state.again) send();
        else pools.delete(poolId);
      });
  };
  send();
}

/**
 * Tells the waiting `create` calls, when the caller's transaction commits, that these
 * reservations' operations moved on; one notification per 200 ids (a payload stays under
 * PostgreSQL's 8,000 bytes). Only a hint: a waiter re-reads the reservation either way.
 */
export async function notifyReservationsSettled(trx: Trx, reservationIds: readonly string[]): Promise<void> {
  if (reservationIds.length === 0) return;
  await sql`SELECT ${reservationsSettledNotice(reservationIds)}`.execute(trx);
}

/**
 * notifyReservationsSettled as an SQL expression (the number of notifications), for a statement
 * that writes the settling itself: uncorrelated, so it is evaluated once where it is selected.
 */
export function reservationsSettledNotice(reservationIds: readonly string[]): RawBuilder<number> {
  const payloads: string[] = [];
  for (let i = 0; i < reservationIds.length; i += 200)
    payloads.push(reservationIds.slice(i, i + 200).join(','));
  return sql<number>`(SELECT count(pg_notify(${reservationsSettledChannel}, p)) FROM unnest(${payloads}::text[]) AS p)`;
}
