import { type Kysely, sql } from 'kysely';

/**
 * Pool administration: a pool's policy carries a version, raised by every change (each version is
 * also an audit row with the document), so a decision can name the policy it was taken under.
 */
export async function up(db: Kysely<any>): Promise<void> {
  await sql`
    ALTER TABLE pools ADD COLUMN policy_version integer NOT NULL DEFAULT 1 CHECK (policy_version >= 1);
  `.execute(db);
}

export async function down(db: Kysely<any>): Promise<void> {
  await sql`ALTER TABLE pools DROP COLUMN policy_version;`.execute(db);
}
