import { sql, type Transaction } from 'kysely';
import type { Database, Reservation } from '../../core/database.ts';
import { ComputeError } from '../../domain/errors.ts';
import { newId } from '../../domain/ids.ts';
import { reservationsSettledNotice } from '../notify-channels.ts';
import { preparedMarker } from '../pool.ts';
import { reservationStateEvent } from './lifecycle-events.ts';

type Trx = Transaction<Database>;

/** A reservation a pool-lease batch booked: its row as locked, and where and when. */
export interface BatchPlacement {
  row: Reservation;
  nodeId: string;
  start: number;
  end: number;
}

/** The audit action of a placement by the pool-lease placer (the actor is the lease holder). */
export const poolPlacerAuditAction = 'compute:pool-placer:placed';

/**
 * Marks a batch's booked reservations `placed` in one statement (data-modifying CTEs over
 * unnest): each one's window, conditions cleared, `pending_since` cleared, its lease deadline set
 * from `lease_seconds`, version raised; with one `reservation.placed` outbox event each (the data
 * the inline placer writes: `nodeIds`, `start`, `end`) and one audit row each (action
 * compute:pool-placer:placed, no identity: the context names the lease holder and its epoch), and
 * their waiting creates notified at commit (reservationsSettledNotice). For
 * rows the caller locked and still `pending`; answers each reservation's new version. Codes:
 * INTERNAL when a row is gone.
 */
export async function markBatchPlaced(
  trx: Trx,
  placements: readonly BatchPlacement[],
  placer: { holder: string; epoch: number } | null,
): Promise<Map<string, number>> {
  const versions = new Map<string, number>();
  if (placements.length === 0) return versions;
  const events = placements.map((p) =>
    reservationStateEvent(p.row, 'reservation.placed', 'placed', {
      nodeIds: [p.nodeId],
      start: p.start,
      end: p.end,
    }),
  );
  const contexts = placements.map((p) => ({
    actor: 'pool-placer',
    state: 'placed',
    poolId: p.row.pool_id,
    nodeIds: [p.nodeId],
    ...(placer ? { holder: placer.holder, epoch: placer.epoch } : {}),
  }));
  const { rows } = await sql<{ id: string; version: number }>`${sql.raw(preparedMarker)}
    WITH p AS (
      SELECT * FROM unnest(${placements.map((p) => p.row.id)}::text[],
                           ${placements.map((p) => new Date(p.start).toISOString())}::timestamptz[],
                           ${placements.map((p) => new Date(p.end).toISOString())}::timestamptz[],
                           ${placements.map(() => newId('evt'))}::text[],
                           ${events.map((e) => JSON.stringify(e.data))}::jsonb[],
                           ${contexts.map((c) => JSON.stringify(c))}::jsonb[]) AS p(id, s, e, evt, data, ctx)
    ),
    u AS (
      UPDATE reservations r SET state = 'placed', during = tstzrange(p.s, p.e, '[)'), conditions = '[]'::jsonb,
        gang_topology_value = NULL, pending_since = NULL,
        lease_expires_at = CASE WHEN COALESCE(r.lease_seconds, 0) <> 0
                                THEN compute_now() + make_interval(secs => r.lease_seconds) END,
        version = r.version + 1, updated_at = compute_now()
      FROM p WHERE r.id = p.id
      RETURNING r.id, r.version, r.tenant_id
    ),
    o AS (
      INSERT INTO outbox_events (id, type, subject, tenant_id, data)
      SELECT p.evt, 'reservation.placed', 'reservation/' || u.id, u.tenant_id, p.data
      FROM p JOIN u ON u.id = p.id
    ),
    a AS (
      INSERT INTO audit_events (tenant_id, actor_identity_id, action, resource_type, resource_id, outcome, request_id, context)
      SELECT u.tenant_id, NULL, ${poolPlacerAuditAction}, 'compute-reservation', u.id, 'allowed', NULL, p.ctx
      FROM p JOIN u ON u.id = p.id
    )
    SELECT id, version, ${reservationsSettledNotice(placements.map((p) => p.row.id))} AS notified FROM u`.execute(
    trx,
  );
  for (const r of rows) versions.set(r.id, r.version);
  if (versions.size !== placements.length)
    throw new ComputeError('INTERNAL', 'a reservation the pool-lease batch placed is gone');
  return versions;
}
