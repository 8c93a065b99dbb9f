import { type Kysely, sql } from 'kysely';

/**
 * What the reservation lifecycle workflows keep in the truth beside the reservation: the bind
 * deadline of the current binding attempt, and the index the orphan sweeper scans for non-terminal
 * reservations whose workflow may have gone (it re-checks them against Temporal).
 */
export async function up(db: Kysely<any>): Promise<void> {
  await sql`
    ALTER TABLE reservations ADD COLUMN bind_deadline timestamptz;
    CREATE INDEX reservations_live_idx ON reservations (updated_at)
      WHERE state NOT IN ('draft', 'denied', 'released', 'failed', 'cancelled', 'expired');
  `.execute(db);
}
