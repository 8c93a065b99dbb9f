import { type Kysely, sql } from 'kysely';

/**
 * Drains that finish: a draining node is `drained` from the moment its last allocation ended (or
 * was moved off it), until it is uncordoned. Operator taints need no column: they are NoSchedule
 * node conditions (type `Taint:<reason>`), read by the placer like the controllers' own.
 */
export async function up(db: Kysely<any>): Promise<void> {
  await sql`
    ALTER TABLE nodes ADD COLUMN drained_at timestamptz;
    -- The sweeper's safety net looks only at drains that have not finished.
    CREATE INDEX nodes_draining_unfinished ON nodes (id) WHERE draining AND drained_at IS NULL;
  `.execute(db);
}

export async function down(db: Kysely<any>): Promise<void> {
  await sql`
    DROP INDEX nodes_draining_unfinished;
    ALTER TABLE nodes DROP COLUMN drained_at;
  `.execute(db);
}
