import { createHash } from 'node:crypto';
import { type Compilable, CompiledQuery, Kysely, PostgresDialect, type Transaction } from 'kysely';
import pg from 'pg';
import type { Database, Db } from '../core/database.ts';

export interface DbHandle {
  db: Db;
  pool: pg.Pool;
  close(): Promise<void>;
}

/** The marker a hot statement's text starts with to be prepared once per connection. */
export const preparedMarker = '/*prepared*/';

/**
 * Runs a statement built with Kysely's query builder as a prepared one (see preparedMarker): for
 * the hot ones whose text is fixed (the same columns and conditions on every call). Answers its rows.
 */
export async function executePrepared<R>(db: Db | Transaction<Database>, query: Compilable<R>): Promise<R[]> {
  const compiled = query.compile();
  const { rows } = await db.executeQuery(
    CompiledQuery.raw(`${preparedMarker}${compiled.sql}`, [...compiled.parameters]),
  );
  return rows as R[];
}

/**
 * Statements whose text starts with `preparedMarker` run as named prepared statements (parsed and
 * planned once per connection, then only bound and executed): for the few hot statements of
 * admission, whose texts are fixed (values are always parameters). Everything else is unchanged.
 * PostgreSQL re-plans a prepared statement when the tables it reads change; only a changed result
 * type (`SELECT *` over a table that gained a column) fails it, once, on each connection.
 */
function prepareMarkedStatements(client: pg.PoolClient) {
  const query = client.query.bind(client) as (...args: unknown[]) => unknown;
  const names = new Map<string, string>();
  let generation = 0;
  (client as { query: unknown }).query = (text: unknown, values?: unknown, callback?: unknown) => {
    if (typeof text !== 'string' || !text.startsWith(preparedMarker) || typeof values === 'function') {
      return query(text, values, callback);
    }
    let name = names.get(text);
    if (!name) {
      name = `bc_${createHash('sha1').update(text).digest('hex').slice(0, 20)}_${generation}`;
      names.set(text, name);
    }
    const result = query({ name, text, values }, callback);
    if (result instanceof Promise) {
      return result.catch((error: { code?: string }) => {
        // A table's columns changed under a prepared `*` (a migration while this connection
        // lived): this call fails, the next one prepares the statement afresh under a new name.
        if (error?.code === '0A000') {
          generation++;
          names.delete(text);
        }
        throw error;
      });
    }
    return result;
  };
}

/**
 * How long a pooled connection may sit idle before the pool closes it. A connection opened again
 * costs its first statements more than the round trip: PostgreSQL starts a backend, loads its
 * catalog caches and plans every prepared hot statement afresh. With pg's default of 10 s, the
 * connections a burst opened closed in the lull after it and were opened again at the next, in
 * the open loop's slowest seconds (bench/README.md, 2026-12-07). Bounded by `max` either way.
 */
const idleConnectionMs = 5 * 60_000;

/** Opens a pool and a typed Kysely instance over it. `max` defaults to 10 connections. */
export function createDb(
  databaseUrl: string,
  options: { max?: number; applicationName?: string } = {},
): DbHandle {
  const pool = new pg.Pool({
    connectionString: databaseUrl,
    max: options.max ?? 10,
    idleTimeoutMillis: idleConnectionMs,
    application_name: options.applicationName ?? 'better-compute',
  });
  // An idle client that errors (the server restarted) must not crash the process; nor may one
  // checked out between two queries (pg-pool listens only on idle clients): the next query on it
  // fails instead, and the pool drops it when it is released.
  pool.on('error', () => {});
  pool.on('connect', (client) => client.on('error', () => {}));
  const { db } = useExistingPool(pool);
  return {
    db,
    pool,
    close: () => db.destroy(),
  };
}

/**
 * A typed Kysely instance over a pool its caller owns (an embedder's own `pg.Pool`): `close` leaves
 * the pool open for its owner. Connections the pool opens from now on prepare the marked hot
 * statements; nothing else about them changes.
 */
export function useExistingPool(pool: pg.Pool): DbHandle {
  pool.on('connect', prepareMarkedStatements);
  const db = new Kysely<Database>({ dialect: new PostgresDialect({ pool }) });
  poolsByDb.set(db, pool);
  return { db, pool, close: async () => {} };
}

/** The pool behind each `Db` this module made, so a LISTEN client can reach the same server. */
const poolsByDb = new WeakMap<Db, pg.Pool>();

/**
 * A new, unconnected client with the settings of `db`'s pool, outside the pool (a LISTEN holds its
 * connection for good, which a pooled one must not). Null for a `Db` not made by this module.
 */
export function dedicatedClientFor(db: Db): pg.Client | null {
  const pool = poolsByDb.get(db);
  if (!pool) return null;
  const client = new pg.Client(pool.options);
  // A server restart ends the connection with an error event; its owner reconnects.
  client.on('error', () => {});
  return client;
}
