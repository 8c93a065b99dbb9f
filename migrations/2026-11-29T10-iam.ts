import { type Kysely, sql } from 'kysely';

/**
 * The embedded IAM, in its own PostgreSQL schema `iam`: the tenant tree (one root, the platform),
 * identities (people, service accounts, agents acting for a person under a delegation), hashed API
 * tokens, roles and their bindings, versioned JSON policies, delegated confirmations, the billing
 * ledger (idempotent by key) and per-tenant budgets.
 */
export async function up(db: Kysely<any>): Promise<void> {
  await sql`
    CREATE SCHEMA IF NOT EXISTS iam;

    CREATE TABLE iam.tenants (
      id text PRIMARY KEY CHECK (id ~ '^[a-z0-9][a-z0-9_-]{0,62}$'),
      name text NOT NULL,
      parent_id text REFERENCES iam.tenants(id),
      created_at timestamptz NOT NULL DEFAULT compute_now(),
      CHECK ((parent_id IS NULL) OR (parent_id <> id))
    );
    -- Exactly one root: the platform.
    CREATE UNIQUE INDEX tenants_one_root ON iam.tenants ((true)) WHERE parent_id IS NULL;

    CREATE TABLE iam.identities (
      id text PRIMARY KEY,
      tenant_id text NOT NULL REFERENCES iam.tenants(id),
      kind text NOT NULL CHECK (kind IN ('person', 'service', 'agent')),
      name text NOT NULL,
      email text,
      disabled_at timestamptz,
      created_at timestamptz NOT NULL DEFAULT compute_now(),
      UNIQUE (tenant_id, name)
    );

    -- An agent acting for a person; actions in confirm_actions are held for the person's approval.
    CREATE TABLE iam.delegations (
      id text PRIMARY KEY,
      agent_identity_id text NOT NULL REFERENCES iam.identities(id),
      person_identity_id text NOT NULL REFERENCES iam.identities(id),
      confirm_actions text[] NOT NULL DEFAULT '{}',
      revoked_at timestamptz,
      created_at timestamptz NOT NULL DEFAULT compute_now()
    );

    CREATE TABLE iam.tokens (
      id text PRIMARY KEY,
      identity_id text NOT NULL REFERENCES iam.identities(id),
      name text NOT NULL DEFAULT '',
      secret_hash text NOT NULL UNIQUE,
      delegation_id text REFERENCES iam.delegations(id),
      expires_at timestamptz,
      revoked_at timestamptz,
      last_used_at timestamptz,
      created_at timestamptz NOT NULL DEFAULT compute_now()
    );
    CREATE INDEX tokens_identity_idx ON iam.tokens (identity_id);

    -- tenant_id NULL: a built-in role every tenant can bind.
    CREATE TABLE iam.roles (
      id text PRIMARY KEY,
      tenant_id text REFERENCES iam.tenants(id),
      name text NOT NULL,
      actions text[] NOT NULL,
      created_at timestamptz NOT NULL DEFAULT compute_now()
    );
    CREATE UNIQUE INDEX roles_name_idx ON iam.roles (COALESCE(tenant_id, ''), name);

    -- A role granted to an identity on a tenant and every tenant below it.
    CREATE TABLE iam.role_bindings (
      identity_id text NOT NULL REFERENCES iam.identities(id),
      role_id text NOT NULL REFERENCES iam.roles(id),
      tenant_id text NOT NULL REFERENCES iam.tenants(id),
      created_at timestamptz NOT NULL DEFAULT compute_now(),
      PRIMARY KEY (identity_id, role_id, tenant_id)
    );

    -- Versioned policies: applying a name again adds a version; the newest version is in force.
    CREATE TABLE iam.policies (
      id text PRIMARY KEY,
      tenant_id text NOT NULL REFERENCES iam.tenants(id),
      name text NOT NULL,
      version integer NOT NULL,
      document jsonb NOT NULL,
      disabled boolean NOT NULL DEFAULT false,
      created_by text,
      created_at timestamptz NOT NULL DEFAULT compute_now(),
      UNIQUE (tenant_id, name, version)
    );

    CREATE TABLE iam.confirmations (
      id text PRIMARY KEY,
      tenant_id text NOT NULL,
      delegation_id text NOT NULL REFERENCES iam.delegations(id),
      agent_identity_id text NOT NULL,
      person_identity_id text NOT NULL,
      action text NOT NULL,
      resource_type text NOT NULL,
      resource_id text NOT NULL,
      state text NOT NULL DEFAULT 'pending' CHECK (state IN ('pending', 'approved', 'denied')),
      expires_at timestamptz NOT NULL,
      decided_at timestamptz,
      created_at timestamptz NOT NULL DEFAULT compute_now()
    );
    CREATE INDEX confirmations_lookup_idx ON iam.confirmations
      (agent_identity_id, action, resource_type, resource_id, created_at DESC);

    CREATE TABLE iam.usage_records (
      idempotency_key text PRIMARY KEY,
      tenant_id text NOT NULL,
      meter text NOT NULL,
      quantity numeric NOT NULL CHECK (quantity >= 0),
      window_start timestamptz NOT NULL,
      window_end timestamptz NOT NULL,
      subject text NOT NULL,
      recorded_at timestamptz NOT NULL DEFAULT compute_now()
    );
    CREATE INDEX usage_records_tenant_idx ON iam.usage_records (tenant_id, meter, window_start);

    -- A budget per tenant and meter ('*' for every meter) over a calendar month.
    CREATE TABLE iam.budgets (
      tenant_id text NOT NULL REFERENCES iam.tenants(id),
      meter text NOT NULL DEFAULT '*',
      limit_amount numeric NOT NULL CHECK (limit_amount >= 0),
      updated_at timestamptz NOT NULL DEFAULT compute_now(),
      PRIMARY KEY (tenant_id, meter)
    );

    CREATE TABLE iam.feature_flags (
      tenant_id text NOT NULL REFERENCES iam.tenants(id),
      feature text NOT NULL,
      enabled boolean NOT NULL,
      PRIMARY KEY (tenant_id, feature)
    );

    INSERT INTO iam.roles (id, tenant_id, name, actions) VALUES
      ('role_admin', NULL, 'admin', ARRAY['compute:*']),
      ('role_member', NULL, 'member', ARRAY['compute:reservations:*', 'compute:capacity:*', 'compute:pools:read']),
      ('role_viewer', NULL, 'viewer', ARRAY['compute:reservations:read', 'compute:capacity:read', 'compute:pools:read']);
  `.execute(db);
}

export async function down(db: Kysely<any>): Promise<void> {
  await sql`DROP SCHEMA iam CASCADE`.execute(db);
}
