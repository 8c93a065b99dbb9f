import { type Kysely, sql } from 'kysely';

/**
 * Indexes the inline placer and capacity reads lean on: live allocations by window (which nodes
 * of a pool are busy in a window, without scanning every device), and reservations by owner.
 */
export async function up(db: Kysely<any>): Promise<void> {
  await sql`
    CREATE INDEX allocations_live_during_idx ON allocations USING gist (during)
      WHERE state NOT IN ('released', 'failed');
    CREATE INDEX reservations_owner_idx ON reservations (tenant_id, owner_identity_id, id DESC)
      WHERE state <> 'draft';
    CREATE INDEX devices_node_class_idx ON devices (node_id, class) WHERE removed_at IS NULL AND bookable;
  `.execute(db);
}

export async function down(db: Kysely<any>): Promise<void> {
  await sql`
    DROP INDEX allocations_live_during_idx;
    DROP INDEX reservations_owner_idx;
    DROP INDEX devices_node_class_idx;
  `.execute(db);
}
