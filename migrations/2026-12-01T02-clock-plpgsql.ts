import { type Kysely, sql } from 'kysely';

/**
 * compute_now() in PL/pgSQL. As a SQL function it could not be inlined (it reads compute_clock),
 * so every call site of every statement parsed and planned its query afresh: about 20 µs a call,
 * and a placement's statements call it a dozen times. PL/pgSQL plans the query once per
 * connection (about 5 µs a call). Same clock, same snapshot: a STABLE function of either language
 * reads compute_clock as its calling statement sees it.
 */
export async function up(db: Kysely<any>): Promise<void> {
  await sql`
    CREATE OR REPLACE FUNCTION compute_now() RETURNS timestamptz LANGUAGE plpgsql STABLE AS $$
    DECLARE
      clock timestamptz;
    BEGIN
      SELECT COALESCE(frozen_at, now() + offset_by) INTO clock FROM compute_clock;
      RETURN clock;
    END
    $$`.execute(db);
}

export async function down(db: Kysely<any>): Promise<void> {
  await sql`
    CREATE OR REPLACE FUNCTION compute_now() RETURNS timestamptz LANGUAGE sql STABLE AS $$
      SELECT COALESCE(frozen_at, now() + offset_by) FROM compute_clock
    $$`.execute(db);
}
