import { type Kysely, sql } from 'kysely';

/**
 * The scalar guard of scalar_bookings' inserts checks a statement once instead of each row: one
 * AFTER INSERT ... FOR EACH STATEMENT trigger over the rows inserted (a transition table) replaces
 * the two BEFORE row triggers (guard_scalar_booking, then guard_scalar_booking_with_holds), three
 * queries and two trigger calls a row. bench/scalar-guard.ts (2,000 nodes, 100,000 bookings, one
 * client, windows near the bookings' end as they are near now in a running pool; bench/README.md,
 * 2026-12-07): the guard's time for the pool-lease batch's statement of 24 rows went from 1.53 to
 * 0.33 ms (0.22×; the statement's from 3.6 to 1.7 ms), for the inline placer's 2 rows from 0.18 to
 * 0.08 ms. Part of it was planning: the row guard's sum, its parameters the row's values, was
 * planned afresh for each row; with generic plans forced the row triggers took 0.59 ms for 24 rows,
 * still 1.9 times the statement trigger's 0.31. The statement trigger's queries have no parameters
 * and are planned once a session. With windows anywhere in the year each lookup reads half the
 * node's bookings and the gain shrinks: 0.87 to 0.63 ms for 24 rows, none for 2.
 *
 * The trigger runs two statements, in this order:
 * 1. the traffic light: the distinct (node, resource) rows of host_resources the statement booked,
 *    locked in the global order (node, then resource, as lockHostRowsAndDevices takes them), so
 *    two statements never wait for each other's rows in a cycle;
 * 2. the proof: for each row inserted, every booking of its node and resource overlapping its
 *    window (scalar_bookings, the statement's own rows included since the trigger runs after them,
 *    and hold_bookings), summed against allocatable. Sessions run READ COMMITTED, so this second
 *    statement takes its snapshot after the locks were granted and sees whatever a writer that
 *    held them before committed. One statement that locked and summed would not: its snapshot,
 *    and so its sums, would predate the wait for the locks.
 * The first offending row (in the same order) raises BC001 with the row guard's message, its
 * "booked" the sum without the row's own amount, so the application still reads
 * ` <resource> of node <node> ` out of it. A row whose resource row is missing fails the foreign
 * key (23503) first: the foreign key's row triggers run before a statement trigger.
 *
 * The lock is FOR NO KEY UPDATE, not the row guard's FOR UPDATE, because of that order: when the
 * trigger runs, the foreign key's checks have already locked the same rows FOR KEY SHARE, and two
 * statements that both hold that share and both ask FOR UPDATE wait for each other (16 writers of
 * one node without locks of their own: 93 % of them failed with 40P01). NO KEY UPDATE does not
 * conflict with KEY SHARE, and conflicts with itself and with the FOR UPDATE taken by the hold
 * guard, lockHostRowsAndDevices and the inline placer: guarded writers of a node's resource still
 * go one at a time, and a hold and a reservation still never take the same cores, whichever
 * commits first.
 *
 * The check counts every row of the statement overlapping a row's window, whatever their order,
 * as the pool-lease batch's own re-check does; the row guard counted the rows inserted before each
 * only, so its verdict on a statement could depend on the order of its rows (both count bookings
 * that overlap the window but not each other: conservative, never an over-booking).
 *
 * Updates (an extension, a carried release, a truncation) are rare and row by row: one BEFORE
 * UPDATE row trigger, skipped by its WHEN clause for an update that only shrinks a booking, locks
 * and sums through guard_host_scalar_sum, the hold guard's function (scalar and hold bookings in
 * one query), where two triggers ran before.
 */
export async function up(db: Kysely<any>): Promise<void> {
  await sql`
    DROP TRIGGER scalar_bookings_guard ON scalar_bookings;
    DROP TRIGGER scalar_bookings_hold_guard ON scalar_bookings;
    DROP FUNCTION guard_scalar_booking();
    DROP FUNCTION guard_scalar_booking_with_holds();

    CREATE FUNCTION guard_scalar_bookings_inserted() RETURNS trigger LANGUAGE plpgsql AS $$
    DECLARE
      over record;
    BEGIN
      -- The arrays find the rows through the primary key: joined with the transition table, the
      -- host rows were planned as a hash of every one of them (2 ms at 6,000 rows).
      PERFORM 1 FROM host_resources
        WHERE node_id = ANY (ARRAY(SELECT node_id FROM new_bookings))
          AND resource = ANY (ARRAY(SELECT resource FROM new_bookings))
          AND (node_id, resource) IN (SELECT node_id, resource FROM new_bookings)
        ORDER BY node_id COLLATE "C", resource COLLATE "C"
        FOR NO KEY UPDATE;
      -- Each lookup a correlated subquery, so each is an index probe.
      SELECT n.node_id, n.resource, n.amount, t.cap, t.booked INTO over
        FROM new_bookings n
        CROSS JOIN LATERAL (
          SELECT (SELECT allocatable FROM host_resources WHERE node_id = n.node_id AND resource = n.resource) AS cap,
                 COALESCE((SELECT sum(amount) FROM scalar_bookings
                            WHERE node_id = n.node_id AND resource = n.resource
                              AND coalesce(upper(during), 'infinity'::timestamptz) >= lower(n.during)
                              AND during && n.during), 0)
               + COALESCE((SELECT sum(amount) FROM hold_bookings
                            WHERE node_id = n.node_id AND resource = n.resource
                              AND coalesce(upper(during), 'infinity'::timestamptz) >= lower(n.during)
                              AND during && n.during), 0) AS booked) AS t
        WHERE t.booked > t.cap
        ORDER BY n.node_id COLLATE "C", n.resource COLLATE "C", n.allocation_id
        LIMIT 1;
      IF FOUND THEN
        RAISE EXCEPTION 'scalar resource % of node % over-booked: % booked + % asked > % allocatable',
          over.resource, over.node_id, over.booked - over.amount, over.amount, over.cap
          USING ERRCODE = 'BC001';
      END IF;
      RETURN NULL;
    END $$;
    CREATE TRIGGER scalar_bookings_guard AFTER INSERT ON scalar_bookings
      REFERENCING NEW TABLE AS new_bookings
      FOR EACH STATEMENT EXECUTE FUNCTION guard_scalar_bookings_inserted();

    CREATE FUNCTION guard_scalar_booking_update() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
      PERFORM guard_host_scalar_sum(NEW.node_id, NEW.resource, NEW.amount, NEW.during, NEW.allocation_id, NULL);
      RETURN NEW;
    END $$;
    CREATE TRIGGER scalar_bookings_update_guard BEFORE UPDATE ON scalar_bookings
      FOR EACH ROW
      WHEN (NOT (NEW.node_id = OLD.node_id AND NEW.resource = OLD.resource
                 AND NEW.amount <= OLD.amount AND NEW.during <@ OLD.during))
      EXECUTE FUNCTION guard_scalar_booking_update();
  `.execute(db);
}

/** The two row triggers back, with their functions as 2026-12-03T00 left them. */
export async function down(db: Kysely<any>): Promise<void> {
  await sql`
    DROP TRIGGER scalar_bookings_update_guard ON scalar_bookings;
    DROP FUNCTION guard_scalar_booking_update();
    DROP TRIGGER scalar_bookings_guard ON scalar_bookings;
    DROP FUNCTION guard_scalar_bookings_inserted();

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
        WHERE node_id = NEW.node_id AND resource = NEW.resource
          AND coalesce(upper(during), 'infinity'::timestamptz) >= lower(NEW.during)
          AND during && NEW.during AND allocation_id <> NEW.allocation_id;
      IF booked + NEW.amount > cap THEN
        RAISE EXCEPTION 'scalar resource % of node % over-booked: % booked + % asked > % allocatable',
          NEW.resource, NEW.node_id, booked, NEW.amount, cap
          USING ERRCODE = 'BC001';
      END IF;
      RETURN NEW;
    END $$;
    CREATE TRIGGER scalar_bookings_guard BEFORE INSERT OR UPDATE ON scalar_bookings
      FOR EACH ROW EXECUTE FUNCTION guard_scalar_booking();

    CREATE FUNCTION guard_scalar_booking_with_holds() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
      IF TG_OP = 'UPDATE' AND NEW.node_id = OLD.node_id AND NEW.resource = OLD.resource
         AND NEW.amount <= OLD.amount AND NEW.during <@ OLD.during THEN
        RETURN NEW;
      END IF;
      IF EXISTS (SELECT 1 FROM hold_bookings
                  WHERE node_id = NEW.node_id AND resource = NEW.resource
                    AND coalesce(upper(during), 'infinity'::timestamptz) >= lower(NEW.during)
                    AND during && NEW.during) THEN
        PERFORM guard_host_scalar_sum(NEW.node_id, NEW.resource, NEW.amount, NEW.during, NEW.allocation_id, NULL);
      END IF;
      RETURN NEW;
    END $$;
    CREATE TRIGGER scalar_bookings_hold_guard BEFORE INSERT OR UPDATE ON scalar_bookings
      FOR EACH ROW EXECUTE FUNCTION guard_scalar_booking_with_holds();
  `.execute(db);
}
