import { type Kysely, sql } from 'kysely';

/**
 * Host holds: workload kinds declared per pool, holds that a placed workload keeps on its host
 * (heartbeated, expiring by themselves), their scalar bookings refereed by the same guard as
 * reservations' scalar bookings, and the ledger of unmet demand.
 */
export async function up(db: Kysely<any>): Promise<void> {
  await sql`
    -- What one hold of a kind takes on a host, declared by the pool's owner.
    CREATE TABLE hold_kinds (
      pool_id text NOT NULL REFERENCES pools(id),
      name text NOT NULL,
      cpu_cores numeric NOT NULL CHECK (cpu_cores >= 0),
      ram_gib numeric NOT NULL CHECK (ram_gib >= 0),
      vram_gib numeric NOT NULL DEFAULT 0 CHECK (vram_gib >= 0),
      ttl_seconds integer CHECK (ttl_seconds BETWEEN 3 AND 86400),
      created_at timestamptz NOT NULL DEFAULT compute_now(),
      updated_at timestamptz NOT NULL DEFAULT compute_now(),
      PRIMARY KEY (pool_id, name)
    );

    -- A hold is live while heartbeat_at + ttl_seconds is in the future and it is not released.
    CREATE TABLE host_holds (
      id text PRIMARY KEY,
      tenant_id text NOT NULL,
      pool_id text NOT NULL REFERENCES pools(id),
      node_id text NOT NULL REFERENCES nodes(id) ON DELETE CASCADE,
      kind text NOT NULL,
      holder text NOT NULL,
      owner_identity_id text NOT NULL,
      idempotency_key text,
      cpu_cores numeric NOT NULL,
      ram_gib numeric NOT NULL,
      vram_gib numeric NOT NULL,
      ttl_seconds integer NOT NULL CHECK (ttl_seconds > 0),
      -- Taken while the host had no fresh publication: nothing could be judged, it was written anyway.
      on_trust boolean NOT NULL DEFAULT false,
      acquired_at timestamptz NOT NULL DEFAULT compute_now(),
      heartbeat_at timestamptz NOT NULL DEFAULT compute_now(),
      released_at timestamptz,
      UNIQUE (tenant_id, owner_identity_id, idempotency_key)
    );
    CREATE INDEX host_holds_node_idx ON host_holds (node_id, heartbeat_at);
    CREATE INDEX host_holds_tenant_idx ON host_holds (tenant_id, acquired_at DESC);

    -- A hold's scalar bookings: the same shape as scalar_bookings, refereed with them.
    CREATE TABLE hold_bookings (
      hold_id text NOT NULL REFERENCES host_holds(id) ON DELETE CASCADE,
      node_id text NOT NULL,
      resource text NOT NULL,
      amount numeric NOT NULL CHECK (amount > 0),
      during tstzrange NOT NULL CHECK (NOT isempty(during)),
      PRIMARY KEY (hold_id, resource),
      FOREIGN KEY (node_id, resource) REFERENCES host_resources(node_id, resource) ON DELETE CASCADE
    );
    CREATE INDEX hold_bookings_node_idx ON hold_bookings USING gist (node_id, resource, during);

    -- The scalar guard, extended to holds: the node's resource row locked (the traffic light),
    -- then reservations' and holds' bookings overlapping the window summed against allocatable
    -- (the proof). It runs beside guard_scalar_booking on scalar_bookings, so a hold and a
    -- reservation can never take the same cores, whichever commits first.
    CREATE FUNCTION guard_host_scalar_sum(p_node text, p_resource text, p_amount numeric, p_during tstzrange,
                                          p_allocation text, p_hold text) RETURNS void LANGUAGE plpgsql AS $$
    DECLARE
      cap numeric;
      booked numeric;
    BEGIN
      SELECT allocatable INTO cap FROM host_resources
        WHERE node_id = p_node AND resource = p_resource FOR UPDATE;
      SELECT COALESCE((SELECT sum(amount) FROM scalar_bookings
                        WHERE node_id = p_node AND resource = p_resource AND during && p_during
                          AND allocation_id IS DISTINCT FROM p_allocation), 0)
           + COALESCE((SELECT sum(amount) FROM hold_bookings
                        WHERE node_id = p_node AND resource = p_resource AND during && p_during
                          AND hold_id IS DISTINCT FROM p_hold), 0)
        INTO booked;
      IF booked + p_amount > cap THEN
        RAISE EXCEPTION 'scalar resource % of node % over-booked: % booked + % asked > % allocatable',
          p_resource, p_node, booked, p_amount, cap
          USING ERRCODE = 'BC001';
      END IF;
    END $$;

    CREATE FUNCTION guard_hold_booking() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
      IF TG_OP = 'UPDATE' AND NEW.node_id = OLD.node_id AND NEW.resource = OLD.resource
         AND NEW.amount <= OLD.amount AND NEW.during <@ OLD.during THEN
        RETURN NEW;
      END IF;
      PERFORM guard_host_scalar_sum(NEW.node_id, NEW.resource, NEW.amount, NEW.during, NULL, NEW.hold_id);
      RETURN NEW;
    END $$;
    CREATE TRIGGER hold_bookings_guard BEFORE INSERT OR UPDATE ON hold_bookings
      FOR EACH ROW EXECUTE FUNCTION guard_hold_booking();

    CREATE FUNCTION guard_scalar_booking_with_holds() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
      IF TG_OP = 'UPDATE' AND NEW.node_id = OLD.node_id AND NEW.resource = OLD.resource
         AND NEW.amount <= OLD.amount AND NEW.during <@ OLD.during THEN
        RETURN NEW;
      END IF;
      IF EXISTS (SELECT 1 FROM hold_bookings WHERE node_id = NEW.node_id AND resource = NEW.resource
                   AND during && NEW.during) THEN
        PERFORM guard_host_scalar_sum(NEW.node_id, NEW.resource, NEW.amount, NEW.during, NEW.allocation_id, NULL);
      END IF;
      RETURN NEW;
    END $$;
    -- Named to fire after scalar_bookings_guard (triggers fire in name order), which took the row lock.
    CREATE TRIGGER scalar_bookings_hold_guard BEFORE INSERT OR UPDATE ON scalar_bookings
      FOR EACH ROW EXECUTE FUNCTION guard_scalar_booking_with_holds();

    -- Unmet demand: every refused hold and every reservation that went pending or was refused for
    -- capacity or quota, once per dedupe key (a retry with the same idempotency key adds nothing).
    CREATE TABLE unmet_demand (
      id bigserial PRIMARY KEY,
      dedupe_key text NOT NULL UNIQUE,
      tenant_id text NOT NULL,
      pool_id text,
      source text NOT NULL CHECK (source IN ('hold', 'reservation')),
      subject_id text,
      shape text NOT NULL,
      kind text,
      device_request jsonb,
      reason text NOT NULL,
      message text NOT NULL,
      recorded_at timestamptz NOT NULL DEFAULT compute_now()
    );
    CREATE INDEX unmet_demand_time_idx ON unmet_demand (recorded_at);
    CREATE INDEX unmet_demand_tenant_idx ON unmet_demand (tenant_id, recorded_at);
  `.execute(db);
}

export async function down(db: Kysely<any>): Promise<void> {
  await sql`
    DROP TABLE unmet_demand;
    DROP TRIGGER scalar_bookings_hold_guard ON scalar_bookings;
    DROP FUNCTION guard_scalar_booking_with_holds();
    DROP TABLE hold_bookings;
    DROP FUNCTION guard_hold_booking();
    DROP FUNCTION guard_host_scalar_sum(text, text, numeric, tstzrange, text, text);
    DROP TABLE host_holds;
    DROP TABLE hold_kinds;
  `.execute(db);
}
