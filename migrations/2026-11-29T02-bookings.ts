import { type Kysely, sql } from 'kysely';

/**
 * Reservations, their allocations and the bookings that referee them. The EXCLUDE constraint on
 * device_bookings allows one live booking per atom per instant; scalar bookings are guarded as
 * strictly by a trigger that locks the node's resource row and checks the sum.
 */
export async function up(db: Kysely<any>): Promise<void> {
  await sql`
    CREATE TABLE reservations (
      id text PRIMARY KEY,
      tenant_id text NOT NULL,
      pool_id text NOT NULL REFERENCES pools(id),
      owner_identity_id text NOT NULL,
      idempotency_key text NOT NULL,
      request jsonb NOT NULL,
      request_hash text NOT NULL,
      state text NOT NULL CHECK (state IN ('draft', 'denied', 'awaiting-confirmation', 'pending', 'placed',
        'binding', 'active', 'releasing', 'released', 'failed', 'cancelled', 'expired')),
      -- Calendar reservations book a future window; gangs have one allocation per node.
      requested_start timestamptz,
      duration_ms bigint NOT NULL CHECK (duration_ms > 0),
      during tstzrange,
      gang_size integer NOT NULL DEFAULT 1 CHECK (gang_size BETWEEN 1 AND 64),
      binding_kind text NOT NULL DEFAULT 'hold' CHECK (binding_kind IN ('hold', 'kubernetes', 'node', 'instance')),
      spot boolean NOT NULL DEFAULT false,
      preempt_notice_until timestamptz,
      lease_seconds integer,
      lease_expires_at timestamptz,
      project_id text,
      host_share jsonb,
      conditions jsonb NOT NULL DEFAULT '[]',
      bind_attempts integer NOT NULL DEFAULT 0,
      pending_since timestamptz,
      confirmation_id text,
      confirmation_expires_at timestamptz,
      admission_context jsonb,
      end_reason text,
      lifecycle_started_at timestamptz,
      version integer NOT NULL DEFAULT 1,
      created_at timestamptz NOT NULL DEFAULT compute_now(),
      updated_at timestamptz NOT NULL DEFAULT compute_now(),
      UNIQUE (tenant_id, owner_identity_id, idempotency_key)
    );
    CREATE INDEX reservations_tenant_idx ON reservations (tenant_id, id DESC) WHERE state <> 'draft';
    CREATE INDEX reservations_pool_state_idx ON reservations (pool_id, state);
    CREATE INDEX reservations_orphan_idx ON reservations (created_at)
      WHERE lifecycle_started_at IS NULL AND state NOT IN ('draft', 'denied', 'released', 'failed', 'cancelled', 'expired');

    -- What quota a reservation charged, so a refund is exact and happens once.
    CREATE TABLE quota_charges (
      reservation_id text NOT NULL REFERENCES reservations(id) ON DELETE CASCADE,
      tenant_id text NOT NULL,
      pool_id text NOT NULL,
      resource text NOT NULL,
      amount numeric NOT NULL CHECK (amount > 0),
      charged_at timestamptz NOT NULL DEFAULT compute_now(),
      refunded_at timestamptz,
      PRIMARY KEY (reservation_id, resource)
    );

    -- VPS instances own allocations too (they book through the same capacity port).
    CREATE TABLE instances (
      id text PRIMARY KEY,
      tenant_id text NOT NULL,
      pool_id text NOT NULL REFERENCES pools(id),
      flavor text NOT NULL,
      desired_state text NOT NULL CHECK (desired_state IN ('running', 'stopped', 'deleted')),
      state text NOT NULL,
      spec jsonb NOT NULL DEFAULT '{}',
      version integer NOT NULL DEFAULT 1,
      created_at timestamptz NOT NULL DEFAULT compute_now(),
      updated_at timestamptz NOT NULL DEFAULT compute_now()
    );

    -- A placement on one node. A gang has one allocation per node (gang_index 0..n-1).
    CREATE TABLE allocations (
      id text PRIMARY KEY,
      reservation_id text REFERENCES reservations(id),
      instance_id text REFERENCES instances(id),
      node_id text NOT NULL REFERENCES nodes(id),
      gang_index integer NOT NULL DEFAULT 0,
      state text NOT NULL CHECK (state IN ('planned', 'binding', 'bound', 'releasing', 'released', 'failed')),
      during tstzrange NOT NULL,
      resources jsonb NOT NULL DEFAULT '{}',
      -- The binding as the node reported it (CDI device names, env file, cgroup parent).
      binding jsonb,
      attested boolean NOT NULL DEFAULT false,
      bound_report bytea,
      bound_sig_kid text,
      bound_sig bytea,
      bound_at timestamptz,
      released_at timestamptz,
      created_at timestamptz NOT NULL DEFAULT compute_now(),
      updated_at timestamptz NOT NULL DEFAULT compute_now(),
      CHECK ((reservation_id IS NULL) <> (instance_id IS NULL))
    );
    CREATE INDEX allocations_reservation_idx ON allocations (reservation_id);
    CREATE INDEX allocations_node_idx ON allocations (node_id) WHERE state NOT IN ('released', 'failed');

    CREATE TABLE device_bookings (
      device_id text NOT NULL REFERENCES devices(id),
      allocation_id text NOT NULL REFERENCES allocations(id) ON DELETE CASCADE,
      during tstzrange NOT NULL CHECK (NOT isempty(during)),
      PRIMARY KEY (allocation_id, device_id),
      CONSTRAINT device_bookings_no_overlap EXCLUDE USING gist (device_id WITH =, during WITH &&)
    );

    CREATE TABLE scalar_bookings (
      allocation_id text NOT NULL REFERENCES allocations(id) ON DELETE CASCADE,
      node_id text NOT NULL,
      resource text NOT NULL,
      amount numeric NOT NULL CHECK (amount > 0),
      during tstzrange NOT NULL CHECK (NOT isempty(during)),
      PRIMARY KEY (allocation_id, resource),
      FOREIGN KEY (node_id, resource) REFERENCES host_resources(node_id, resource)
    );
    CREATE INDEX scalar_bookings_node_idx ON scalar_bookings USING gist (node_id, resource, during);

    -- The scalar guard: the row lock on the node's resource row serializes writers (the traffic
    -- light); the sum of every booking overlapping the new window must stay within allocatable (the
    -- proof). Counting every overlapping booking, even ones that do not overlap each other, is
    -- conservative and never over-books.
    CREATE FUNCTION guard_scalar_booking() RETURNS trigger LANGUAGE plpgsql AS $$
    DECLARE
      cap numeric;
      booked numeric;
    BEGIN
      IF TG_OP = 'UPDATE' AND NEW.node_id = OLD.node_id AND NEW.resource = OLD.resource
         AND NEW.amount <= OLD.amount AND NEW.during <@ OLD.during THEN
        RETURN NEW;
      END IF;
      SELECT allocatable INTO cap FROM host_resources
        WHERE node_id = NEW.node_id AND resource = NEW.resource FOR UPDATE;
      SELECT COALESCE(sum(amount), 0) INTO booked FROM scalar_bookings
        WHERE node_id = NEW.node_id AND resource = NEW.resource AND during && NEW.during
          AND allocation_id <> NEW.allocation_id;
      IF booked + NEW.amount > cap THEN
        RAISE EXCEPTION 'scalar resource % of node % over-booked: % booked + % asked > % allocatable',
          NEW.resource, NEW.node_id, booked, NEW.amount, cap
          USING ERRCODE = 'BC001';
      END IF;
      RETURN NEW;
    END $$;
    CREATE TRIGGER scalar_bookings_guard BEFORE INSERT OR UPDATE ON scalar_bookings
      FOR EACH ROW EXECUTE FUNCTION guard_scalar_booking();

    -- One extend at a time stages its pending change in the authz projection.
    CREATE TABLE extend_holds (
      reservation_id text PRIMARY KEY REFERENCES reservations(id) ON DELETE CASCADE,
      hold text NOT NULL,
      taken_at timestamptz NOT NULL DEFAULT compute_now()
    );

    -- One row per allocation, hour and meter ('gpu.h100.hours'); sent to billing by its key.
    CREATE TABLE usage_windows (
      allocation_id text NOT NULL REFERENCES allocations(id),
      hour_start timestamptz NOT NULL,
      meter text NOT NULL,
      tenant_id text NOT NULL,
      reservation_id text,
      quantity numeric NOT NULL CHECK (quantity >= 0),
      idempotency_key text NOT NULL UNIQUE,
      recorded_at timestamptz NOT NULL DEFAULT compute_now(),
      sent_at timestamptz,
      PRIMARY KEY (allocation_id, hour_start, meter)
    );
  `.execute(db);
}
