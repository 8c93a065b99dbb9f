import { sql } from 'kysely';
import type { Db, Reservation } from '../../core/database.ts';
import {
  type HostResourceAmounts,
  type NormalizedRequest,
  startGraceMs,
} from '../../domain/reservation-request.ts';
import { preparedMarker } from '../pool.ts';
import { loaderPerDb, togetherOrEachAlone } from '../soon-loader.ts';

/** One draft to insert, as writeDraft resolved it. */
export interface DraftInsert {
  id: string;
  tenantId: string;
  poolId: string;
  ownerIdentityId: string;
  idempotencyKey: string;
  request: NormalizedRequest;
  hash: string;
  /** The pool's calendar horizon in milliseconds (a requested start must fall within it). */
  horizonMs: number;
  /** The host resources it books per GPU share, as stored in `host_share`. */
  share: HostResourceAmounts;
  /** The authz projection's attributes of the reservation. */
  attributes: Record<string, unknown>;
}

/** What the insert found for one draft. */
export interface DraftInserted {
  /** The draft as stored; null when it was not inserted (its key taken, not offered, or out of horizon). */
  row: Reservation | null;
  offered: boolean;
  inHorizon: boolean;
  /** compute_now() as the statement read it, in whole epoch milliseconds. */
  checkedAt: number;
}

type InsertedRow = Reservation & { ord: number; offered: boolean; in_horizon: boolean; checked_at: string };

/**
 * Drafts inserted in one statement, each with its authz projection row: for each, the pool's offer
 * to the tenant and the requested start's horizon (at most 5 minutes past, at most `horizonMs`
 * ahead of compute_now()) re-checked, and nothing inserted for a key already taken (a concurrent
 * first call's insert is waited for). Rows are inserted in id order, so two such statements
 * waiting on each other's keys cannot deadlock. When one key comes twice, its first comes first
 * and only that one is answered with the row it inserted.
 */
async function insertDrafts(db: Db, drafts: readonly DraftInsert[]): Promise<DraftInserted[]> {
  const input = drafts.map((d, ord) => ({
    ord,
    id: d.id,
    tenant_id: d.tenantId,
    pool_id: d.poolId,
    owner_identity_id: d.ownerIdentityId,
    idempotency_key: d.idempotencyKey,
    request: d.request,
    request_hash: d.hash,
    requested_start: d.request.start !== undefined ? new Date(d.request.start).toISOString() : null,
    start_ms: d.request.start ?? null,
    horizon_ms: d.horizonMs,
    duration_ms: d.request.durationMs,
    binding_kind: d.request.binding,
    spot: d.request.spot ?? false,
    lease_seconds: d.request.leaseSeconds ?? null,
    project_id: d.request.projectId ?? null,
    host_share: d.share,
    gang_size: d.request.gang?.size ?? 1,
    attributes: d.attributes,
  }));
  const { rows } = await sql<InsertedRow>`${sql.raw(preparedMarker)}
    WITH clock AS (SELECT floor(extract(epoch FROM compute_now()) * 1000)::bigint AS now_ms),
    input AS (
      SELECT * FROM jsonb_to_recordset(${JSON.stringify(input)}::jsonb) AS i(
        ord integer, id text, tenant_id text, pool_id text, owner_identity_id text, idempotency_key text,
        request jsonb, request_hash text, requested_start timestamptz, start_ms bigint, horizon_ms bigint,
        duration_ms bigint, binding_kind text, spot boolean, lease_seconds integer, project_id text,
        host_share jsonb, gang_size integer, attributes jsonb)
    ), checked AS (
      SELECT i.*,
             EXISTS (SELECT 1 FROM pools p
                     WHERE p.id = i.pool_id AND p.archived_at IS NULL
                       AND (p.owner_tenant_id = i.tenant_id
                            OR EXISTS (SELECT 1 FROM pool_offers o WHERE o.pool_id = p.id AND o.tenant_id = i.tenant_id))) AS offered,
             (i.start_ms IS NULL
              OR i.start_ms BETWEEN c.now_ms - ${startGraceMs}::bigint AND c.now_ms + i.horizon_ms) AS in_horizon
      FROM input i CROSS JOIN clock c
    ), r AS (
      INSERT INTO reservations (id, tenant_id, pool_id, owner_identity_id, idempotency_key, request, request_hash,
                                state, requested_start, duration_ms, binding_kind, spot, lease_seconds, project_id,
                                host_share, gang_size)
      SELECT id, tenant_id, pool_id, owner_identity_id, idempotency_key, request, request_hash,
             'draft', requested_start, duration_ms, binding_kind, spot, lease_seconds, project_id,
             host_share, gang_size
      FROM checked WHERE offered AND in_horizon
      ORDER BY id, ord
      ON CONFLICT DO NOTHING
      RETURNING *
    ), authz AS (
      INSERT INTO authz_projection (resource_type, resource_id, tenant_id, parent_type, parent_id, owner_identity_id,
                                    attributes)
      SELECT 'compute-reservation', r.id, r.tenant_id, 'compute-pool', r.pool_id, r.owner_identity_id, c.attributes
      FROM r JOIN (SELECT DISTINCT ON (id) id, attributes FROM checked ORDER BY id, ord) c ON c.id = r.id
      ON CONFLICT (resource_type, resource_id) DO UPDATE
        SET attributes = EXCLUDED.attributes, updated_at = compute_now()
    )
    SELECT r.*, c.ord, c.offered, c.in_horizon, (SELECT now_ms FROM clock)::text AS checked_at
    FROM checked c LEFT JOIN r ON r.id = c.id
    ORDER BY c.ord`.execute(db);
  const answered = new Set<string>();
  return rows.map((found) => {
    const { ord, offered, in_horizon: inHorizon, checked_at: checkedAt, ...row } = found;
    const id = row.id as string | null;
    // The draft that was inserted is the first of its id, and its own request (a second request
    // under the same key, gathered with it, then answers CONFLICT through the repeated-key path).
    const first = id !== null && !answered.has(id) && row.request_hash === drafts[ord]!.hash;
    if (first) answered.add(id);
    return { row: first ? row : null, offered, inHorizon, checkedAt: Number(checkedAt) };
  });
}

/** The loader that gathers concurrent draft inserts (insertDraftSoon). */
const draftLoader = loaderPerDb(
  (db, drafts: readonly DraftInsert[]) =>
    togetherOrEachAlone(
      drafts,
      (all) => insertDrafts(db, all),
      async (draft) => (await insertDrafts(db, [draft]))[0]!,
    ),
  { maxBatchSize: 100 },
);

/**
 * A draft inserted together with every other draft asked for before the event loop's next turn,
 * in one statement (insertDrafts): concurrent creates share one round trip and one commit. A draft
 * that statement cannot take (a value out of its column's range) fails alone.
 */
export function insertDraftSoon(db: Db, draft: DraftInsert): Promise<DraftInserted> {
  return draftLoader(db).load(draft);
}
