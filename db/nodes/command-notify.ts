import { sql, type Transaction } from 'kysely';
import type { Database, Db } from '../../core/database.ts';
import type { Logger } from '../../core/logger.ts';
import { type ChannelListener, listenOnChannel } from '../listen.ts';

/** The channel a commit that gives a node work notifies, with the node's id as the payload. */
export const nodeWorkChannel = 'bc_node_work';

/**
 * Tells every listening gateway, when the caller's transaction commits, that `nodeId` has new work
 * (a queued command). Nothing is sent if it rolls back; PostgreSQL folds identical notifications of
 * one transaction into one. A notification is only a hint: the gateway's fallback poll covers a
 * lost one. Idempotent.
 */
export async function notifyNodeWork(trx: Transaction<Database>, nodeId: string): Promise<void> {
  await sql`SELECT pg_notify(${nodeWorkChannel}, ${nodeId})`.execute(trx);
}

export type NodeWorkListener = ChannelListener;

/**
 * Holds one dedicated connection (outside `db`'s pool) LISTENing on `nodeWorkChannel` and calls
 * `onWork` with the node ids of each notification, reconnecting when it is lost and calling
 * `onListening` after each LISTEN succeeds (see listenOnChannel). Null when `db` was not made by
 * db/pool.ts (no server to reach): the caller polls instead.
 */
export function listenForNodeWork(
  db: Db,
  input: {
    log: Logger;
    onWork: (nodeId: string) => void;
    onListening: () => void;
    /** First reconnect delay; it doubles up to `maxRetryMs`. */
    retryMs?: number;
    maxRetryMs?: number;
  },
): NodeWorkListener | null {
  return listenOnChannel(db, {
    channel: nodeWorkChannel,
    log: input.log,
    what: 'command notifications',
    fallback: 'the gateway polls until it listens again',
    onPayload: input.onWork,
    onListening: input.onListening,
    ...(input.retryMs !== undefined ? { retryMs: input.retryMs } : {}),
    ...(input.maxRetryMs !== undefined ? { maxRetryMs: input.maxRetryMs } : {}),
  });
}
