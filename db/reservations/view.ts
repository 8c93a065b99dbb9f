import { sql } from 'kysely';
import type { Db } from '../../core/database.ts';
import type { Condition } from '../../domain/reservation-lifecycle.ts';
import { endedStates, type ReservationState } from '../../domain/reservation-states.ts';
import { operationOf, type ReservationView } from '../../domain/reservation-view.ts';
import { preparedMarker } from '../pool.ts';
import { loaderPerDb } from '../soon-loader.ts';
import { repairRecordOf, type StoredRepair } from './repair.ts';

/** A reservation as the view reads it: its row, its current allocations and its repairs. */
export interface ReservationViewRow {
  id: string;
  tenant_id: string;
  pool_id: string;
  state: ReservationState;
  request: Record<string, unknown>;
  start: Date | null;
  end: Date | null;
  owner_identity_id: string;
  idempotency_key: string;
  project_id: string | null;
  conditions: Condition[];
  lease_seconds: number | null;
  lease_expires_at: Date | null;
  host_share: Record<string, number> | null;
  end_reason: string | null;
  version: number;
  created_at: Date;
  updated_at: Date;
  gang_size: number;
  gang_topology_value: string | null;
  allocations: Array<{
    id: string;
    nodeId: string;
    nodeName: string;
    gangIndex: number;
    state: string;
    deviceIds: string[];
    binding: Record<string, unknown> | null;
  }>;
  repairs: StoredRepair[];
}

/** Reads reservations as the API shows them (allocations of the current placement included), in the order of `ids`. */
export async function readReservationViews(db: Db, ids: readonly string[]): Promise<ReservationView[]> {
  if (ids.length === 0) return [];
  const { rows } = await sql<ReservationViewRow>`${sql.raw(preparedMarker)}
    SELECT r.id, r.tenant_id, r.pool_id, r.state, r.request, lower(r.during) AS start, upper(r.during) AS "end",
           r.owner_identity_id, r.idempotency_key, r.project_id, r.conditions, r.lease_seconds, r.lease_expires_at,
           r.host_share, r.end_reason, r.version, r.created_at, r.updated_at, r.gang_size, r.gang_topology_value,
           COALESCE((SELECT jsonb_agg(jsonb_build_object(
               'id', a.id, 'nodeId', a.node_id, 'state', a.state, 'binding', a.binding,
               'nodeName', (SELECT n.name FROM nodes n WHERE n.id = a.node_id), 'gangIndex', a.gang_index,
               'deviceIds', COALESCE((SELECT jsonb_agg(b.device_id ORDER BY b.device_id) FROM device_bookings b
                                      WHERE b.allocation_id = a.id), '[]'::jsonb)) ORDER BY a.gang_index, a.id)
             FROM allocations a WHERE a.reservation_id = r.id
               AND (a.superseded_at IS NULL OR r.state IN (${sql.join(endedStates.map((s) => sql.lit(s)))}))
               AND a.state <> 'failed'), '[]'::jsonb) AS allocations,
           COALESCE((SELECT jsonb_agg(jsonb_build_object(
               'created_at', floor(extract(epoch FROM p.created_at) * 1000), 'moment', p.moment, 'outcome', p.outcome,
               'moves', p.moves, 'message', p.message, 'workflow_id', p.workflow_id) ORDER BY p.id)
             FROM reservation_repairs p WHERE p.reservation_id = r.id), '[]'::jsonb) AS repairs
    FROM reservations r WHERE ${
      // One id as a scalar: a prepared statement over an array is re-planned at every call.
      ids.length === 1 ? sql`r.id = ${ids[0]}` : sql`r.id = ANY(${ids as string[]}::text[])`
    }`.execute(db);
  const byId = new Map(rows.map((r) => [r.id, r]));
  return ids.flatMap((id) => {
    const r = byId.get(id);
    return r ? [reservationViewOf(r)] : [];
  });
}

/** The API's view of a reservation from what the view reads (or a statement wrote and returned). */
export function reservationViewOf(r: ReservationViewRow): ReservationView {
  const bound = r.allocations.find((a) => a.binding);
  return {
    id: r.id,
    tenantId: r.tenant_id,
    poolId: r.pool_id,
    state: r.state,
    request: r.request,
    during: r.start && r.end ? { start: r.start.getTime(), end: r.end.getTime() } : null,
    ownerIdentityId: r.owner_identity_id,
    idempotencyKey: r.idempotency_key,
    projectId: r.project_id,
    conditions: r.conditions,
    allocations: r.allocations.map(({ binding: _b, gangIndex, ...a }) =>
      r.gang_size > 1 ? { ...a, gangIndex } : a,
    ),
    gang:
      r.gang_size > 1
        ? {
            size: r.gang_size,
            topologyKey: (r.request.gang as { topologyKey?: string } | undefined)?.topologyKey ?? null,
            topologyValue: r.gang_topology_value,
          }
        : null,
    binding: r.state === 'active' && bound?.binding ? { nodeId: bound.nodeId, ...bound.binding } : null,
    lease: r.lease_seconds
      ? { seconds: r.lease_seconds, expiresAt: r.lease_expires_at?.getTime() ?? null }
      : null,
    hostShare: r.host_share,
    endReason: r.end_reason,
    operation: operationOf(r.id, r.state, r.conditions, r.end_reason),
    version: r.version,
    createdAt: r.created_at.getTime(),
    updatedAt: r.updated_at.getTime(),
    repairs: r.repairs.map(repairRecordOf),
  };
}

/** One reservation as the API shows it; undefined when there is none. */
export async function readReservationView(db: Db, id: string): Promise<ReservationView | undefined> {
  return (await readReservationViews(db, [id]))[0];
}

/** The loader that coalesces concurrent view reads (readReservationViewSoon). */
const viewLoader = loaderPerDb(async (db, ids: readonly string[]) => {
  const views = new Map((await readReservationViews(db, ids)).map((view) => [view.id, view]));
  return ids.map((id) => views.get(id));
});

/**
 * readReservationView for a caller among many reading at the same moment, such as the creates a
 * pool-lease batch's commit wakes together: every id asked for before the event loop's next turn
 * is read in one statement. Nothing is cached; each call reads afresh.
 */
export function readReservationViewSoon(db: Db, id: string): Promise<ReservationView | undefined> {
  return viewLoader(db).load(id);
}

/**
 * The ids of one page of a tenant's reservations (never drafts), newest first (created_at, then
 * id): only `ownerIdentityId`'s when given, only in `states` and `poolId` when given, after the
 * reservation `cursor`. Reads `limit + 1` rows, so `more` tells whether a further page exists.
 */
export async function listReservationIds(
  db: Db,
  input: {
    tenantId: string;
    ownerIdentityId?: string;
    states?: readonly ReservationState[];
    poolId?: string | undefined;
    cursor?: string | undefined;
    limit: number;
  },
): Promise<{ ids: string[]; more: boolean }> {
  let query = db
    .selectFrom('reservations')
    .select(['id', 'created_at'])
    .where('tenant_id', '=', input.tenantId)
    .where('state', '<>', 'draft');
  if (input.ownerIdentityId !== undefined)
    query = query.where('owner_identity_id', '=', input.ownerIdentityId);
  if (input.states) query = query.where('state', 'in', input.states);
  if (input.poolId) query = query.where('pool_id', '=', input.poolId);
  if (input.cursor) {
    query = query.where(
      sql<boolean>`(created_at, id) < (SELECT r.created_at, r.id FROM reservations r
                    WHERE r.id = ${input.cursor} AND r.tenant_id = ${input.tenantId})`,
    );
  }
  const rows = await query
    .orderBy('created_at', 'desc')
    .orderBy('id', 'desc')
    .limit(input.limit + 1)
    .execute();
  return { ids: rows.slice(0, input.limit).map((r) => r.id), more: rows.length > input.limit };
}
