import { type Kysely, sql } from 'kysely';

/**
 * Gang reservations: the topology value a gang was placed on (its members are re-placed on the
 * same one), how often each member was re-placed on its own, and at most one current member per
 * node of a reservation (a gang's members are distinct nodes).
 */
export async function up(db: Kysely<any>): Promise<void> {
  await sql`
    ALTER TABLE reservations ADD COLUMN gang_topology_value text;
    -- 0 for a member as first placed; a member re-placed on its own carries its predecessor's + 1.
    ALTER TABLE allocations ADD COLUMN member_attempt integer NOT NULL DEFAULT 0 CHECK (member_attempt >= 0);
    CREATE UNIQUE INDEX allocations_current_member_node ON allocations (reservation_id, node_id)
      WHERE superseded_at IS NULL AND reservation_id IS NOT NULL;
  `.execute(db);
}

export async function down(db: Kysely<any>): Promise<void> {
  await sql`
    DROP INDEX allocations_current_member_node;
    ALTER TABLE allocations DROP COLUMN member_attempt;
    ALTER TABLE reservations DROP COLUMN gang_topology_value;
  `.execute(db);
}
