import { type Kysely, sql } from 'kysely';

/**
 * Signed bcd releases and their rollouts.
 *
 * releases: one signed manifest of a bcd version on a channel (unique per channel and version;
 * rollback protection refuses a version not above the channel's newest), its signatures and the
 * pins that counted, its expiry. release_files: each file's bytes, checked against the manifest at
 * publish (bcd checks them again).
 *
 * rollouts: one move of selected nodes to a release in waves, run by the Temporal workflow of the
 * same id; rollout_nodes: each selected node's wave, its place in the health gate, and the epoch
 * and version it started from (the gate needs a newer epoch; a rollback the old version).
 *
 * nodes: the session protocol bcd declared, and what bcd last reported about its own health and
 * updates, each with the session epoch it came in.
 *
 * Migration 2026-11-29T04 held placeholder tables of these names that nothing ever wrote: they are
 * replaced (down restores them).
 */
export async function up(db: Kysely<any>): Promise<void> {
  await sql`
    DROP TABLE rollout_nodes;
    DROP TABLE rollouts;
    DROP TABLE releases;

    CREATE TABLE releases (
      id text PRIMARY KEY,
      channel text NOT NULL,
      version text NOT NULL,
      protocol_version integer NOT NULL,
      min_control_plane_version text NOT NULL,
      manifest jsonb NOT NULL,
      manifest_digest text NOT NULL UNIQUE,
      signatures jsonb NOT NULL,
      signer_pins text[] NOT NULL,
      expires_at timestamptz NOT NULL,
      published_by text,
      created_at timestamptz NOT NULL DEFAULT compute_now(),
      UNIQUE (channel, version)
    );

    CREATE TABLE release_files (
      release_id text NOT NULL REFERENCES releases(id) ON DELETE CASCADE,
      path text NOT NULL,
      size integer NOT NULL,
      sha256 text NOT NULL,
      content bytea NOT NULL,
      PRIMARY KEY (release_id, path)
    );

    CREATE TABLE rollouts (
      id text PRIMARY KEY,
      release_id text NOT NULL REFERENCES releases(id),
      created_by text NOT NULL,
      idempotency_key text NOT NULL,
      request_hash text NOT NULL,
      selector jsonb NOT NULL,
      waves jsonb NOT NULL,
      state text NOT NULL DEFAULT 'running' CHECK (state IN ('running', 'paused', 'completed', 'aborted')),
      current_wave integer NOT NULL DEFAULT 0,
      pause_reason text,
      abort_mode text CHECK (abort_mode IN ('stop', 'rollback')),
      rollback_done boolean NOT NULL DEFAULT false,
      created_at timestamptz NOT NULL DEFAULT compute_now(),
      updated_at timestamptz NOT NULL DEFAULT compute_now(),
      finished_at timestamptz,
      UNIQUE (created_by, idempotency_key)
    );
    CREATE INDEX rollouts_state_idx ON rollouts (state, created_at);

    CREATE TABLE rollout_nodes (
      rollout_id text NOT NULL REFERENCES rollouts(id) ON DELETE CASCADE,
      node_id text NOT NULL REFERENCES nodes(id),
      pool_id text NOT NULL REFERENCES pools(id),
      wave integer NOT NULL,
      position integer NOT NULL,
      state text NOT NULL DEFAULT 'pending' CHECK (state IN
        ('pending', 'updating', 'soaking', 'done', 'failed', 'skipped', 'rolling-back', 'rolled-back')),
      from_version text,
      start_epoch bigint,
      command_id text,
      started_at timestamptz,
      healthy_since timestamptz,
      finished_at timestamptz,
      reason text,
      -- A failure an operator resumed past (it no longer counts toward the wave's threshold).
      acknowledged boolean NOT NULL DEFAULT false,
      PRIMARY KEY (rollout_id, node_id)
    );
    CREATE INDEX rollout_nodes_in_progress_idx ON rollout_nodes (pool_id)
      WHERE state IN ('updating', 'soaking', 'rolling-back');

    ALTER TABLE nodes ADD COLUMN protocol_version integer;
    ALTER TABLE nodes ADD COLUMN bcd_health text CHECK (bcd_health IN ('healthy', 'unhealthy'));
    ALTER TABLE nodes ADD COLUMN bcd_health_epoch bigint;
    ALTER TABLE nodes ADD COLUMN bcd_update_report jsonb;
  `.execute(db);
}

export async function down(db: Kysely<any>): Promise<void> {
  await sql`
    ALTER TABLE nodes DROP COLUMN bcd_update_report;
    ALTER TABLE nodes DROP COLUMN bcd_health_epoch;
    ALTER TABLE nodes DROP COLUMN bcd_health;
    ALTER TABLE nodes DROP COLUMN protocol_version;
    DROP TABLE rollout_nodes;
    DROP TABLE rollouts;
    DROP TABLE release_files;
    DROP TABLE releases;

    CREATE TABLE releases (
      id text PRIMARY KEY,
      version text NOT NULL UNIQUE,
      manifest jsonb NOT NULL,
      signatures jsonb NOT NULL DEFAULT '[]',
      created_at timestamptz NOT NULL DEFAULT compute_now()
    );
    CREATE TABLE rollouts (
      id text PRIMARY KEY,
      release_id text NOT NULL REFERENCES releases(id),
      state text NOT NULL CHECK (state IN ('running', 'paused', 'succeeded', 'failed', 'cancelled')),
      waves jsonb NOT NULL DEFAULT '[1, 10, 50, 100]',
      current_wave integer NOT NULL DEFAULT 0,
      created_at timestamptz NOT NULL DEFAULT compute_now(),
      updated_at timestamptz NOT NULL DEFAULT compute_now()
    );
    CREATE TABLE rollout_nodes (
      rollout_id text NOT NULL REFERENCES rollouts(id),
      node_id text NOT NULL REFERENCES nodes(id),
      wave integer NOT NULL,
      state text NOT NULL CHECK (state IN ('waiting', 'upgrading', 'succeeded', 'failed', 'skipped')),
      updated_at timestamptz NOT NULL DEFAULT compute_now(),
      PRIMARY KEY (rollout_id, node_id)
    );
  `.execute(db);
}
