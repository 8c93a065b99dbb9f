import { type Kysely, sql } from 'kysely';

/**
 * The gateway's records: every attested report a node sent about one of its allocations, stored as
 * received (body, key id, signature) before anything acts on it, and the index the gateway's
 * delivery loop reads its connected nodes by.
 */
export async function up(db: Kysely<any>): Promise<void> {
  await sql`
    CREATE TABLE allocation_reports (
      id bigserial PRIMARY KEY,
      allocation_id text NOT NULL REFERENCES allocations(id) ON DELETE CASCADE,
      node_id text NOT NULL REFERENCES nodes(id),
      kind text NOT NULL CHECK (kind IN ('bound', 'failed', 'released')),
      -- The node's epoch for the session that carried it.
      epoch bigint NOT NULL,
      report bytea NOT NULL,
      sig_kid text,
      sig bytea,
      received_at timestamptz NOT NULL DEFAULT compute_now()
    );
    CREATE INDEX allocation_reports_allocation_idx ON allocation_reports (allocation_id, id DESC);

    CREATE INDEX nodes_session_gateway_idx ON nodes (session_gateway) WHERE session_gateway IS NOT NULL;
  `.execute(db);
}
