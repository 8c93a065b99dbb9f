import { type Kysely, sql } from 'kysely';

/**
 * Admission hardening: the index the draft cleanup scans for refused requests past their
 * retention; the committed extends by idempotency key, so a retried extend answers its first
 * result; and delegated confirmations bound to the request they approve and used at most once.
 */
export async function up(db: Kysely<any>): Promise<void> {
  await sql`
    -- Refused requests (a draft left by QUOTA_EXCEEDED or SPEND_LIMIT_REACHED, a denial, an
    -- expired confirmation), oldest last touched first.
    CREATE INDEX reservations_refused_idx ON reservations (updated_at)
      WHERE state IN ('draft', 'denied', 'expired');

    -- One row per extend that moved a reservation's end, under the caller's idempotency key.
    CREATE TABLE reservation_extends (
      reservation_id text NOT NULL REFERENCES reservations(id) ON DELETE CASCADE,
      actor_identity_id text NOT NULL,
      idempotency_key text NOT NULL,
      request_hash text NOT NULL,
      previous_end timestamptz NOT NULL,
      new_end timestamptz NOT NULL,
      created_at timestamptz NOT NULL DEFAULT compute_now(),
      PRIMARY KEY (reservation_id, actor_identity_id, idempotency_key)
    );

    -- The request a confirmation was asked for (its hash), and when an approval admitted it.
    ALTER TABLE iam.confirmations ADD COLUMN request_hash text, ADD COLUMN used_at timestamptz;
  `.execute(db);
}
