import { type Kysely, sql } from 'kysely';

/**
 * What every mutation leaves behind in its own transaction: the authz projection IAM decides on,
 * the audit trail, the event outbox and durable node commands.
 */
export async function up(db: Kysely<any>): Promise<void> {
  await sql`
    CREATE TABLE authz_projection (
      resource_type text NOT NULL,
      resource_id text NOT NULL,
      tenant_id text NOT NULL,
      parent_type text,
      parent_id text,
      owner_identity_id text,
      attributes jsonb NOT NULL DEFAULT '{}',
      -- A staged change (an extend's new duration) that a decision reads before it applies.
      pending jsonb,
      updated_at timestamptz NOT NULL DEFAULT compute_now(),
      PRIMARY KEY (resource_type, resource_id)
    );
    CREATE INDEX authz_projection_tenant_idx ON authz_projection (tenant_id, resource_type);

    CREATE TABLE audit_events (
      id bigserial PRIMARY KEY,
      at timestamptz NOT NULL DEFAULT compute_now(),
      tenant_id text,
      actor_identity_id text,
      action text NOT NULL,
      resource_type text NOT NULL,
      resource_id text NOT NULL,
      outcome text NOT NULL DEFAULT 'allowed',
      request_id text,
      -- The admission context: identity, session kind, agent, delegation and request id.
      context jsonb NOT NULL DEFAULT '{}'
    );
    CREATE INDEX audit_events_resource_idx ON audit_events (resource_type, resource_id);

    -- Every event, written in the transaction of the change it describes.
    CREATE TABLE outbox_events (
      seq bigserial PRIMARY KEY,
      id text NOT NULL UNIQUE,
      type text NOT NULL,
      subject text NOT NULL,
      tenant_id text,
      data jsonb NOT NULL DEFAULT '{}',
      created_at timestamptz NOT NULL DEFAULT compute_now()
    );
    CREATE INDEX outbox_events_subject_idx ON outbox_events (subject, seq);
    CREATE INDEX outbox_events_tenant_idx ON outbox_events (tenant_id, seq);

    -- Durable one-shot messages to one node, ordered by a per-node sequence, delivered per lane.
    CREATE TABLE node_commands (
      id text PRIMARY KEY,
      node_id text NOT NULL REFERENCES nodes(id),
      seq bigint NOT NULL,
      kind text NOT NULL,
      lane text NOT NULL CHECK (lane IN ('control', 'provision', 'bulk')),
      payload jsonb NOT NULL DEFAULT '{}',
      not_before timestamptz,
      not_after timestamptz,
      min_generation bigint,
      state text NOT NULL DEFAULT 'queued'
        CHECK (state IN ('queued', 'delivered', 'running', 'succeeded', 'failed', 'expired', 'cancelled')),
      journal_id text,
      result jsonb,
      error text,
      created_at timestamptz NOT NULL DEFAULT compute_now(),
      delivered_at timestamptz,
      completed_at timestamptz,
      UNIQUE (node_id, seq)
    );
    CREATE INDEX node_commands_pending_idx ON node_commands (node_id, seq)
      WHERE state IN ('queued', 'delivered', 'running');
  `.execute(db);
}
