import { type Kysely, sql } from 'kysely';

/**
 * Bare metal: site join tokens (a site agent joins its site, not a pool), the
 * `site:<id>:boot` lease with its fencing epoch (exactly one connected site agent serves network
 * boot for its site), and the BMC of each bare machine, reached over Redfish by the site agent
 * only, its credentials sealed with the deployment secret.
 */
export async function up(db: Kysely<any>): Promise<void> {
  await sql`
    CREATE TABLE site_join_tokens (
      id text PRIMARY KEY,
      site_id text NOT NULL REFERENCES sites(id),
      secret_hash text NOT NULL,
      expires_at timestamptz NOT NULL,
      max_uses integer NOT NULL DEFAULT 1 CHECK (max_uses >= 1),
      uses integer NOT NULL DEFAULT 0 CHECK (uses <= max_uses),
      revoked_at timestamptz,
      created_by text,
      created_at timestamptz NOT NULL DEFAULT compute_now()
    );
    CREATE INDEX site_join_tokens_site_idx ON site_join_tokens (site_id);

    -- The lease 'site:<id>:boot'. The epoch grows by one each time the lease changes hands (or is
    -- taken again after it lapsed); writes of a site agent carry the epoch they were given.
    CREATE TABLE site_boot_leases (
      site_id text PRIMARY KEY REFERENCES sites(id),
      holder_node_id text NOT NULL REFERENCES nodes(id),
      epoch bigint NOT NULL CHECK (epoch >= 1),
      acquired_at timestamptz NOT NULL DEFAULT compute_now(),
      renewed_at timestamptz NOT NULL DEFAULT compute_now(),
      expires_at timestamptz NOT NULL
    );

    -- The BMC of a bare machine (a node of the site). The password is written only sealed.
    CREATE TABLE bmc_endpoints (
      node_id text PRIMARY KEY REFERENCES nodes(id),
      site_id text NOT NULL REFERENCES sites(id),
      address text NOT NULL,
      system_id text NOT NULL,
      username text NOT NULL,
      password_sealed text NOT NULL,
      power_state text CHECK (power_state IN ('on', 'off', 'unknown')),
      boot_device text,
      last_error text,
      observed_at timestamptz,
      created_at timestamptz NOT NULL DEFAULT compute_now(),
      updated_at timestamptz NOT NULL DEFAULT compute_now(),
      UNIQUE (address, system_id)
    );
    CREATE INDEX bmc_endpoints_site_idx ON bmc_endpoints (site_id);

    -- Provision states: 'cleaning' (a machine wiped before it is ready again). The legal moves
    -- between them are one table in domain/provision-states.ts.
    ALTER TABLE nodes DROP CONSTRAINT nodes_provision_state_check;
    ALTER TABLE nodes ADD CONSTRAINT nodes_provision_state_check CHECK (provision_state IN
      ('adopting', 'enrolling', 'inspecting', 'available', 'ready', 'deploying', 'deployed', 'cleaning',
       'retiring', 'retired'));

    -- Images are content-addressed (sha256) and named name@version within their tenant; verified
    -- only when their signature checks against the deployment's signer pins. Unsigned (or
    -- unverified) images stay private to their tenant.
    ALTER TABLE images DROP CONSTRAINT images_name_version_key;
    ALTER TABLE images
      ADD COLUMN tenant_id text NOT NULL DEFAULT '',
      ADD COLUMN url text NOT NULL DEFAULT '',
      ADD COLUMN size_bytes bigint CHECK (size_bytes >= 0),
      ADD COLUMN signer_pin text,
      ADD CONSTRAINT images_sha256_check CHECK (sha256 ~ '^[0-9a-f]{64}$'),
      ADD CONSTRAINT images_tenant_name_version_key UNIQUE (tenant_id, name, version);
    ALTER TABLE images ALTER COLUMN tenant_id DROP DEFAULT, ALTER COLUMN url DROP DEFAULT;

    -- Profiles: immutable versions; used_at is set by the first workflow that expands one.
    ALTER TABLE profiles ADD COLUMN name text NOT NULL DEFAULT '';
    ALTER TABLE profiles ALTER COLUMN name DROP DEFAULT;
    CREATE UNIQUE INDEX profiles_tenant_name_version_idx ON profiles (tenant_id, name, version);

    -- Provisioning workflows (deploy, clean): one active per node, enforced here. A failed or
    -- aborted one leaves its node in maintenance with the reason; 'failed' ones may be retried.
    ALTER TABLE metal_workflows DROP CONSTRAINT metal_workflows_state_check;
    ALTER TABLE metal_workflows
      ADD CONSTRAINT metal_workflows_state_check
        CHECK (state IN ('running', 'succeeded', 'failed', 'aborted')),
      ADD COLUMN kind text NOT NULL DEFAULT 'deploy' CHECK (kind IN ('deploy', 'inspect', 'clean')),
      ADD COLUMN site_id text NOT NULL REFERENCES sites(id),
      ADD COLUMN tenant_id text NOT NULL,
      ADD COLUMN idempotency_key text,
      ADD COLUMN phase text NOT NULL DEFAULT 'main' CHECK (phase IN ('main', 'cleanup')),
      ADD COLUMN reason text,
      ADD COLUMN abort_requested text,
      ADD COLUMN allocation_id text,
      ADD COLUMN updated_at timestamptz NOT NULL DEFAULT compute_now();
    ALTER TABLE metal_workflows ALTER COLUMN profile_id DROP NOT NULL,
      ALTER COLUMN profile_version DROP NOT NULL;
    ALTER TABLE metal_workflows DROP COLUMN steps;
    DROP INDEX metal_workflows_one_active;
    CREATE UNIQUE INDEX metal_workflows_one_active ON metal_workflows (node_id)
      WHERE state IN ('running', 'failed');
    CREATE UNIQUE INDEX metal_workflows_idempotency_idx ON metal_workflows (node_id, idempotency_key)
      WHERE idempotency_key IS NOT NULL;

    -- The persisted steps of a workflow, expanded from its profile; attempts hold every try.
    CREATE TABLE metal_workflow_steps (
      workflow_id text NOT NULL REFERENCES metal_workflows(id),
      idx integer NOT NULL CHECK (idx >= 0),
      phase text NOT NULL CHECK (phase IN ('main', 'cleanup')),
      name text NOT NULL,
      target text NOT NULL CHECK (target IN ('control-plane', 'site', 'node', 'ramdisk')),
      action jsonb NOT NULL,
      await_rejoin boolean NOT NULL DEFAULT false,
      timeout_seconds integer NOT NULL CHECK (timeout_seconds >= 1),
      max_attempts integer NOT NULL CHECK (max_attempts >= 1),
      state text NOT NULL DEFAULT 'pending'
        CHECK (state IN ('pending', 'running', 'succeeded', 'failed', 'skipped')),
      attempts jsonb NOT NULL DEFAULT '[]',
      error text,
      started_at timestamptz,
      finished_at timestamptz,
      PRIMARY KEY (workflow_id, idx)
    );

    -- Single-use discovery tokens, each for one machine: the ramdisk a site agent network-boots
    -- joins with one and the site agent's signed assertion (role 'ramdisk'); the system a deploy
    -- wrote joins with one and a proof by the ramdisk's own key (role 'node').
    CREATE TABLE discovery_tokens (
      id text PRIMARY KEY,
      node_id text NOT NULL REFERENCES nodes(id),
      role text NOT NULL CHECK (role IN ('ramdisk', 'node')),
      site_id text NOT NULL REFERENCES sites(id),
      workflow_id text REFERENCES metal_workflows(id),
      secret_hash text NOT NULL,
      expires_at timestamptz NOT NULL,
      used_at timestamptz,
      created_at timestamptz NOT NULL DEFAULT compute_now()
    );
    CREATE INDEX discovery_tokens_node_idx ON discovery_tokens (node_id);
  `.execute(db);
}
