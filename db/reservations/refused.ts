import { sql, type Transaction } from 'kysely';
import type { Database } from '../../core/database.ts';
import { refusedStates } from '../../domain/reservation-states.ts';

type Trx = Transaction<Database>;

/**
 * Removes at most `limit` refused requests (`refusedStates`: drafts admission left, denials,
 * expired confirmations) last touched more than `retentionMs` before compute_now(), oldest first,
 * with their authz rows, in the caller's transaction. A reservation that ever held an allocation
 * is never removed, nor one whose row another transaction holds (admission deciding it again: a
 * retry touches its draft, so its retention starts over). Answers the ids it removed. Idempotent:
 * a second run removes only what has become old enough since.
 */
export async function deleteRefusedReservations(
  trx: Trx,
  input: { retentionMs: number; limit: number },
): Promise<string[]> {
  const { rows } = await sql<{ id: string }>`
    WITH doomed AS (
      SELECT r.id FROM reservations r
      WHERE r.state IN (${sql.join(refusedStates.map((s) => sql.lit(s)))})
        AND r.updated_at < compute_now() - make_interval(secs => ${input.retentionMs / 1000})
        AND NOT EXISTS (SELECT 1 FROM allocations a WHERE a.reservation_id = r.id)
      ORDER BY r.updated_at
      LIMIT ${input.limit}
      FOR UPDATE OF r SKIP LOCKED
    ), authz AS (
      DELETE FROM authz_projection p USING doomed d
      WHERE p.resource_type = 'compute-reservation' AND p.resource_id = d.id
    )
    DELETE FROM reservations r USING doomed d WHERE r.id = d.id
    RETURNING r.id`.execute(trx);
  return rows.map((r) => r.id);
}
