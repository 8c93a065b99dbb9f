import { type Kysely, sql } from 'kysely';

/**
 * compute_abort(reason): raises SQLSTATE BC002 with `reason` as its message. A statement that
 * writes several tables at once (admission's placement in one statement) calls it when one of its
 * guarded writes found nothing to change, so the whole statement fails and none of it stays.
 */
export async function up(db: Kysely<any>): Promise<void> {
  await sql`
    CREATE FUNCTION compute_abort(reason text) RETURNS boolean LANGUAGE plpgsql VOLATILE AS $$
    BEGIN
      RAISE EXCEPTION USING ERRCODE = 'BC002', MESSAGE = reason;
    END
    $$`.execute(db);
}

export async function down(db: Kysely<any>): Promise<void> {
  await sql`DROP FUNCTION compute_abort(text)`.execute(db);
}
