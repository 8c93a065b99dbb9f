import { type Kysely, sql } from 'kysely';

/**
 * Calendar reservations: every BookingRepair that changed something (moved members, or found no
 * place for them) is kept, so `reservations.get` can show what moved from where to where.
 */
export async function up(db: Kysely<any>): Promise<void> {
  await sql`
    CREATE TABLE reservation_repairs (
      id bigserial PRIMARY KEY,
      reservation_id text NOT NULL REFERENCES reservations(id) ON DELETE CASCADE,
      -- 15 minutes before the start, or at the start.
      moment text NOT NULL CHECK (moment IN ('pre-start', 'start')),
      outcome text NOT NULL CHECK (outcome IN ('repaired', 'failed')),
      -- [{allocationId, fromNodeId, toNodeId, toAllocationId, reason, fromDeviceIds, toDeviceIds}]
      moves jsonb NOT NULL DEFAULT '[]'::jsonb,
      -- Failed: the placer's summary.
      message text,
      workflow_id text,
      created_at timestamptz NOT NULL DEFAULT compute_now()
    );
    CREATE INDEX reservation_repairs_by_reservation ON reservation_repairs (reservation_id, id);
  `.execute(db);
}

export async function down(db: Kysely<any>): Promise<void> {
  await sql`DROP TABLE reservation_repairs`.execute(db);
}
