import { type Kysely, sql } from 'kysely';

/**
 * Node enforcement: an atom that inventory made (a MIG instance after a layout change) becomes
 * bookable only once the node has reported converging the NodeSpec generation that asked for it;
 * and the billing meter a booked atom is metered on is read from its attributes (profile).
 */
export async function up(db: Kysely<any>): Promise<void> {
  await sql`
    -- The NodeSpec generation the node must have converged before this atom may be booked
    -- (0: at once). The placer compares it with nodes.observed_generation.
    ALTER TABLE devices ADD COLUMN bookable_from_generation bigint NOT NULL DEFAULT 0;
  `.execute(db);
}

export async function down(db: Kysely<any>): Promise<void> {
  await sql`ALTER TABLE devices DROP COLUMN bookable_from_generation;`.execute(db);
}
