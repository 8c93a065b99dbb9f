import { type Kysely, sql } from 'kysely';

/**
 * The outbox's readable horizon, for this database alone. Readers emit only rows whose
 * transaction is older than every transaction still in flight; `pg_snapshot_xmin` answers that for
 * the whole cluster, so a transaction left open in another database on the same server (a
 * pg_dump, a report, another application) held back every event stream and webhook here until it
 * ended. `outbox_horizon()` is the oldest transaction in flight that may be this database's: the
 * snapshot's in-flight ids, less those pg_stat_activity shows running in another database (or in
 * no database); with none left, the snapshot's xmax. An id it cannot place (a prepared
 * transaction, a session whose details this role may not see) still holds the horizon back, as
 * before: every transaction of this database older than the horizon has ended.
 */
export async function up(db: Kysely<any>): Promise<void> {
  await sql`
    CREATE FUNCTION outbox_horizon() RETURNS xid8 LANGUAGE sql STABLE AS $$
      WITH snapshot AS (SELECT pg_current_snapshot() AS s),
      elsewhere AS (
        SELECT a.backend_xid::text::bigint AS xid32 FROM pg_stat_activity a
        WHERE a.backend_xid IS NOT NULL
          AND a.datid IS DISTINCT FROM (SELECT oid FROM pg_database WHERE datname = current_database())
      )
      SELECT COALESCE(
        (SELECT min(x) FROM snapshot, pg_snapshot_xip(snapshot.s) AS x
         WHERE (x::text::numeric % 4294967296)::bigint NOT IN (SELECT xid32 FROM elsewhere)),
        (SELECT pg_snapshot_xmax(s) FROM snapshot))
    $$;
  `.execute(db);
}

export async function down(db: Kysely<any>): Promise<void> {
  await sql`DROP FUNCTION outbox_horizon()`.execute(db);
}
