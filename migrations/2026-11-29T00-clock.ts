import { type Kysely, sql } from 'kysely';

/**
 * One clock for the whole control plane: every query reads compute_now(), never now().
 * Tests move it by setting an offset or freezing it in compute_clock.
 */
export async function up(db: Kysely<any>): Promise<void> {
  await sql`CREATE EXTENSION IF NOT EXISTS btree_gist`.execute(db);
  await sql`
    CREATE TABLE compute_clock (
      singleton boolean PRIMARY KEY DEFAULT true CHECK (singleton),
      frozen_at timestamptz,
      offset_by interval NOT NULL DEFAULT '0'
    )`.execute(db);
  await sql`INSERT INTO compute_clock DEFAULT VALUES`.execute(db);
  await sql`
    CREATE FUNCTION compute_now() RETURNS timestamptz LANGUAGE sql STABLE AS $$
      SELECT COALESCE(frozen_at, now() + offset_by) FROM compute_clock
    $$`.execute(db);
}

export async function down(db: Kysely<any>): Promise<void> {
  await sql`DROP FUNCTION compute_now()`.execute(db);
  await sql`DROP TABLE compute_clock`.execute(db);
}
