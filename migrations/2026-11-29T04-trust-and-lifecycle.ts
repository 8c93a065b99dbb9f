import { type Kysely, sql } from 'kysely';

/**
 * Joining and node identity (join tokens, the control plane's CA, node certificates), and the
 * records of what comes next: images and profiles for bare-metal deploys, signed daemon releases
 * and their rollouts in waves.
 */
export async function up(db: Kysely<any>): Promise<void> {
  await sql`
    CREATE TABLE join_tokens (
      id text PRIMARY KEY,
      pool_id text NOT NULL REFERENCES pools(id),
      secret_hash text NOT NULL,
      expires_at timestamptz NOT NULL,
      max_uses integer NOT NULL DEFAULT 1 CHECK (max_uses >= 1),
      uses integer NOT NULL DEFAULT 0 CHECK (uses <= max_uses),
      revoked_at timestamptz,
      created_by text,
      created_at timestamptz NOT NULL DEFAULT compute_now()
    );

    CREATE TABLE certificate_authorities (
      name text PRIMARY KEY,
      trust_domain text NOT NULL,
      certificate_pem text NOT NULL,
      private_key_pem text NOT NULL,
      created_at timestamptz NOT NULL DEFAULT compute_now()
    );

    CREATE TABLE node_certificates (
      serial text PRIMARY KEY,
      node_id text NOT NULL REFERENCES nodes(id),
      role text NOT NULL CHECK (role IN ('node', 'node-tenant', 'site', 'ramdisk')),
      spiffe_id text NOT NULL,
      -- SHA-256 of the SubjectPublicKeyInfo: the key id attested reports name.
      key_id text NOT NULL,
      public_key_pem text NOT NULL,
      certificate_pem text NOT NULL,
      not_before timestamptz NOT NULL,
      not_after timestamptz NOT NULL,
      revoked_at timestamptz,
      created_at timestamptz NOT NULL DEFAULT compute_now()
    );
    CREATE INDEX node_certificates_node_idx ON node_certificates (node_id);
    CREATE INDEX node_certificates_key_idx ON node_certificates (key_id);

    CREATE TABLE images (
      id text PRIMARY KEY,
      name text NOT NULL,
      version text NOT NULL,
      format text NOT NULL CHECK (format IN ('raw', 'qcow2', 'iso')),
      sha256 text NOT NULL,
      signature text,
      verified boolean NOT NULL DEFAULT false,
      created_at timestamptz NOT NULL DEFAULT compute_now(),
      UNIQUE (name, version)
    );

    CREATE TABLE profiles (
      id text NOT NULL,
      version integer NOT NULL,
      tenant_id text NOT NULL,
      image_id text REFERENCES images(id),
      spec jsonb NOT NULL,
      used_at timestamptz,
      created_at timestamptz NOT NULL DEFAULT compute_now(),
      PRIMARY KEY (id, version)
    );

    -- A bare-metal deploy run as a Temporal workflow; one active per node.
    CREATE TABLE metal_workflows (
      id text PRIMARY KEY,
      node_id text NOT NULL REFERENCES nodes(id),
      profile_id text NOT NULL,
      profile_version integer NOT NULL,
      state text NOT NULL CHECK (state IN ('running', 'succeeded', 'failed', 'cancelled')),
      steps jsonb NOT NULL DEFAULT '[]',
      created_at timestamptz NOT NULL DEFAULT compute_now(),
      finished_at timestamptz
    );
    CREATE UNIQUE INDEX metal_workflows_one_active ON metal_workflows (node_id) WHERE state = 'running';

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
