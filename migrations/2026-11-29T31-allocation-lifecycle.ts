import { type Kysely, sql } from 'kysely';

/**
 * Which allocations are a reservation's current placement, and which bound ones lost their binding.
 * `superseded_at` is set when the control plane ends an allocation (a release, or a failed binding
 * placed again); a node's own release report sets only `released_at`, so the lifecycle still sees
 * that allocation and marks the reservation Degraded/BindingLost. `binding_lost_at` records a
 * bound allocation whose later report failed verification (a forged re-report).
 */
export async function up(db: Kysely<any>): Promise<void> {
  await sql`
    ALTER TABLE allocations ADD COLUMN superseded_at timestamptz;
    ALTER TABLE allocations ADD COLUMN binding_lost_at timestamptz;
    UPDATE allocations SET superseded_at = released_at WHERE released_at IS NOT NULL;
    CREATE INDEX allocations_current_idx ON allocations (reservation_id) WHERE superseded_at IS NULL;
  `.execute(db);
}
