import { type Kysely, sql } from 'kysely';

/**
 * The fleet: sites, pools and their offers and quotas, nodes with their independent state axes,
 * devices (atoms and their unbookable parents) and host resource rows.
 */
export async function up(db: Kysely<any>): Promise<void> {
  await sql`
    CREATE TABLE sites (
      id text PRIMARY KEY,
      name text NOT NULL UNIQUE,
      region text NOT NULL,
      kind text NOT NULL DEFAULT 'shared' CHECK (kind IN ('shared', 'dedicated', 'custom')),
      owner_tenant_id text,
      created_at timestamptz NOT NULL DEFAULT compute_now()
    );

    CREATE TABLE pools (
      id text PRIMARY KEY,
      site_id text NOT NULL REFERENCES sites(id),
      owner_tenant_id text NOT NULL,
      name text NOT NULL,
      gpu_model text NOT NULL,
      class text NOT NULL DEFAULT 'metal-host'
        CHECK (class IN ('metal-host', 'metal-dedicated', 'vps-host', 'provider')),
      sharing_mode text NOT NULL DEFAULT 'exclusive'
        CHECK (sharing_mode IN ('exclusive', 'mig', 'time-slice', 'mps')),
      policy jsonb NOT NULL DEFAULT '{}',
      archived_at timestamptz,
      created_at timestamptz NOT NULL DEFAULT compute_now(),
      UNIQUE (owner_tenant_id, name)
    );

    CREATE TABLE pool_offers (
      pool_id text NOT NULL REFERENCES pools(id),
      tenant_id text NOT NULL,
      priority integer NOT NULL DEFAULT 0,
      on_budget_exceeded text NOT NULL DEFAULT 'allow' CHECK (on_budget_exceeded IN ('allow', 'stop-new', 'drain')),
      created_at timestamptz NOT NULL DEFAULT compute_now(),
      PRIMARY KEY (pool_id, tenant_id)
    );

    -- One row per tenant, pool and resource ('gpu', 'gpu.mig', 'gpu.slot', 'vcpu', 'memoryGiB').
    -- A missing row grants zero. 'used' is charged all or nothing under the row lock.
    CREATE TABLE quotas (
      tenant_id text NOT NULL,
      pool_id text NOT NULL REFERENCES pools(id),
      resource text NOT NULL,
      limit_amount numeric NOT NULL CHECK (limit_amount >= 0),
      used numeric NOT NULL DEFAULT 0 CHECK (used >= 0),
      PRIMARY KEY (tenant_id, pool_id, resource)
    );

    CREATE TABLE projects (
      id text PRIMARY KEY,
      tenant_id text NOT NULL,
      name text NOT NULL,
      created_at timestamptz NOT NULL DEFAULT compute_now(),
      UNIQUE (tenant_id, name)
    );

    CREATE TABLE nodes (
      id text PRIMARY KEY,
      site_id text NOT NULL REFERENCES sites(id),
      pool_id text REFERENCES pools(id),
      name text NOT NULL,
      role text NOT NULL DEFAULT 'node' CHECK (role IN ('node', 'node-tenant', 'site', 'ramdisk')),
      provision_state text NOT NULL DEFAULT 'enrolling' CHECK (provision_state IN
        ('adopting', 'enrolling', 'inspecting', 'available', 'ready', 'deploying', 'deployed', 'retiring', 'retired')),
      cordoned boolean NOT NULL DEFAULT false,
      cordon_reason text,
      draining boolean NOT NULL DEFAULT false,
      maintenance boolean NOT NULL DEFAULT false,
      maintenance_reason text,
      power_state text NOT NULL DEFAULT 'unknown' CHECK (power_state IN ('on', 'off', 'unknown')),
      connectivity text NOT NULL DEFAULT 'unknown' CHECK (connectivity IN ('connected', 'unreachable', 'unknown')),
      -- Fences sessions: every new session increments it, writes carrying an older epoch are refused.
      epoch bigint NOT NULL DEFAULT 0,
      session_gateway text,
      last_heartbeat_at timestamptz,
      agent_version text,
      capabilities text[] NOT NULL DEFAULT '{}',
      journal_id text,
      -- Desired state: the NodeSpec and its generation, bumped only when its canonical JSON changes.
      spec jsonb NOT NULL DEFAULT '{}',
      spec_generation bigint NOT NULL DEFAULT 0,
      observed_generation bigint,
      next_command_seq bigint NOT NULL DEFAULT 1,
      hardware_key text UNIQUE,
      installed_release_id text,
      created_at timestamptz NOT NULL DEFAULT compute_now(),
      updated_at timestamptz NOT NULL DEFAULT compute_now(),
      UNIQUE (site_id, name)
    );
    CREATE INDEX nodes_pool_idx ON nodes (pool_id);

    CREATE TABLE node_labels (
      node_id text NOT NULL REFERENCES nodes(id) ON DELETE CASCADE,
      key text NOT NULL,
      value text NOT NULL,
      -- 'system' labels come from the gateway (capabilities); only those count for bc.dev/ keys.
      source text NOT NULL CHECK (source IN ('system', 'inventory', 'operator')),
      PRIMARY KEY (node_id, source, key)
    );
    CREATE INDEX node_labels_key_idx ON node_labels (key, value);

    CREATE TABLE node_conditions (
      node_id text NOT NULL REFERENCES nodes(id) ON DELETE CASCADE,
      type text NOT NULL,
      reason text NOT NULL,
      message text NOT NULL DEFAULT '',
      effect text CHECK (effect IN ('NoSchedule')),
      since timestamptz NOT NULL DEFAULT compute_now(),
      updated_at timestamptz NOT NULL DEFAULT compute_now(),
      PRIMARY KEY (node_id, type)
    );

    -- Devices in the style of dynamic resource allocation. Only bookable devices (atoms) are ever
    -- booked; a partitioned GPU is an unbookable parent of its 'gpu.mig' or 'gpu.slot' atoms.
    CREATE TABLE devices (
      id text PRIMARY KEY,
      node_id text NOT NULL REFERENCES nodes(id),
      class text NOT NULL CHECK (class IN ('gpu', 'gpu.mig', 'gpu.slot', 'nic.vf', 'disk', 'node')),
      stable_id text NOT NULL,
      parent_id text REFERENCES devices(id),
      bookable boolean NOT NULL DEFAULT true,
      health text NOT NULL DEFAULT 'healthy' CHECK (health IN ('healthy', 'unhealthy', 'unknown')),
      -- model, memoryMiB, nvlinkDomain, numaNode, migProfile, ...
      attributes jsonb NOT NULL DEFAULT '{}',
      removed_at timestamptz,
      created_at timestamptz NOT NULL DEFAULT compute_now(),
      UNIQUE (node_id, stable_id)
    );
    CREATE INDEX devices_node_idx ON devices (node_id) WHERE removed_at IS NULL;

    -- Scalar host resources a reservation may book beside its devices.
    CREATE TABLE host_resources (
      node_id text NOT NULL REFERENCES nodes(id) ON DELETE CASCADE,
      resource text NOT NULL CHECK (resource IN ('vcpu', 'memoryGiB', 'hugepages2Mi', 'hugepages1Gi')),
      capacity numeric NOT NULL CHECK (capacity >= 0),
      allocatable numeric NOT NULL CHECK (allocatable >= 0),
      PRIMARY KEY (node_id, resource)
    );

    CREATE TABLE inventory_snapshots (
      id bigserial PRIMARY KEY,
      node_id text NOT NULL REFERENCES nodes(id) ON DELETE CASCADE,
      section text NOT NULL,
      hash text NOT NULL,
      data jsonb NOT NULL,
      received_at timestamptz NOT NULL DEFAULT compute_now()
    );
    CREATE INDEX inventory_snapshots_node_idx ON inventory_snapshots (node_id, section, id DESC);
  `.execute(db);
}
