import { type Kysely, sql } from 'kysely';

/**
 * Reading the outbox safely, and webhooks.
 *
 * outbox_events.xid records the writing transaction's id. Readers emit only rows whose
 * transaction is older than every transaction still in flight (`pg_snapshot_xmin`), in
 * (xid, seq) order: that set only ever grows at its end, so a cursor over it never skips a row
 * that commits late, which a plain `seq > last` cursor would (bigserial values commit out of order).
 *
 * webhook_subscriptions: one endpoint of a tenant, its signing secret, the event types it wants,
 * its own cursor into the outbox and its retry state; a lease lets one dispatcher at a time work
 * it. webhook_deliveries records every attempt.
 */
export async function up(db: Kysely<any>): Promise<void> {
  await sql`
    ALTER TABLE outbox_events ADD COLUMN xid xid8 NOT NULL DEFAULT pg_current_xact_id();
    CREATE INDEX outbox_events_xid_seq_idx ON outbox_events (xid, seq);

    CREATE TABLE webhook_subscriptions (
      id text PRIMARY KEY,
      tenant_id text NOT NULL,
      url text NOT NULL CHECK (url ~ '^https?://'),
      secret text NOT NULL,
      -- Empty: every event of the tenant. 'reservation.*' matches a prefix.
      event_types text[] NOT NULL DEFAULT '{}',
      description text NOT NULL DEFAULT '',
      created_by text,
      -- The last outbox position handled (delivered, or given up on after the last attempt).
      cursor_xid xid8 NOT NULL DEFAULT '0',
      cursor_seq bigint NOT NULL DEFAULT 0,
      -- Attempts made on the event after the cursor, and when the next one may run.
      attempts integer NOT NULL DEFAULT 0,
      next_attempt_at timestamptz,
      lease_owner text,
      lease_until timestamptz,
      deleted_at timestamptz,
      created_at timestamptz NOT NULL DEFAULT compute_now(),
      updated_at timestamptz NOT NULL DEFAULT compute_now()
    );
    CREATE INDEX webhook_subscriptions_tenant_idx ON webhook_subscriptions (tenant_id) WHERE deleted_at IS NULL;

    CREATE TABLE webhook_deliveries (
      id text PRIMARY KEY,
      subscription_id text NOT NULL REFERENCES webhook_subscriptions(id) ON DELETE CASCADE,
      event_id text NOT NULL,
      event_seq bigint NOT NULL,
      event_type text NOT NULL,
      attempt integer NOT NULL CHECK (attempt >= 1),
      outcome text NOT NULL CHECK (outcome IN ('succeeded', 'retrying', 'failed')),
      status_code integer,
      error text,
      duration_ms integer NOT NULL,
      created_at timestamptz NOT NULL DEFAULT compute_now()
    );
    CREATE INDEX webhook_deliveries_subscription_idx ON webhook_deliveries (subscription_id, created_at DESC, id DESC);

    -- Reading events is its own action; the built-in member and viewer roles get it.
    UPDATE iam.roles SET actions = array_append(actions, 'compute:events:read')
      WHERE id IN ('role_member', 'role_viewer') AND NOT ('compute:events:read' = ANY (actions));
  `.execute(db);
}

export async function down(db: Kysely<any>): Promise<void> {
  await sql`
    DROP TABLE webhook_deliveries;
    DROP TABLE webhook_subscriptions;
    DROP INDEX outbox_events_xid_seq_idx;
    ALTER TABLE outbox_events DROP COLUMN xid;
  `.execute(db);
}
