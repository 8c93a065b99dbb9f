import { sql, type Transaction } from 'kysely';
import type { Database, Db } from '../../core/database.ts';
import { holdShape, undeclaredHoldShape } from '../../domain/demand.ts';
import { ComputeError } from '../../domain/errors.ts';
import {
  defaultHoldTtlSeconds,
  endedHoldVisibleMs,
  type HoldKind,
  type HoldRefusal,
  type HoldView,
  type HostPublication,
  holdStateAt,
  judgeHold,
  lostRaceRefusal,
  noKindRefusal,
} from '../../domain/holds.ts';
import { publicationOf } from '../../domain/holds-publication.ts';
import { newId } from '../../domain/ids.ts';
import type { CallerAudit } from '../reservations/reservations.ts';
import { recordUnmetDemand } from './demand.ts';
import { findHoldKind } from './kinds.ts';
import { readHostPublicationRows } from './publication.ts';
import { lockUnannouncedExpiries, recordHoldChange } from './records.ts';

type Trx = Transaction<Database>;

/** Holds serialize per node on this advisory lock space before they lock resource rows. */
const holdLockSpace = 7_212;
/** Scalar resources a hold books, in the order every writer locks them (the order of bookings.ts). */
const bookedResources = [
  ['memoryGiB', 'ram_gib'],
  ['vcpu', 'cpu_cores'],
] as const;

export interface HoldTarget {
  id: string;
  name: string;
  pool_id: string;
}

/**
 * The node `target` names (its id, else its name) in a pool the tenant owns or is offered;
 * NOT_FOUND otherwise, INVALID_INPUT when the name is ambiguous across sites.
 */
export async function resolveHoldTarget(db: Db | Trx, tenantId: string, target: string): Promise<HoldTarget> {
  const { rows } = await sql<HoldTarget>`
    SELECT n.id, n.name, n.pool_id FROM nodes n JOIN pools p ON p.id = n.pool_id
    WHERE p.archived_at IS NULL
      AND (p.owner_tenant_id = ${tenantId}
           OR EXISTS (SELECT 1 FROM pool_offers o WHERE o.pool_id = p.id AND o.tenant_id = ${tenantId}))
      AND (n.id = ${target} OR n.name = ${target})
    ORDER BY (n.id = ${target}) DESC, n.id
    LIMIT 3`.execute(db);
  const exact = rows.find((r) => r.id === target);
  if (exact) return exact;
  if (rows.length > 1) {
    throw new ComputeError(
      'INVALID_INPUT',
      `target: '${target}' names ${rows.length} nodes (${rows.map((r) => r.id).join(', ')}); give the node's id`,
    );
  }
  if (!rows[0]) {
    throw new ComputeError(
      'NOT_FOUND',
      `target: no node '${target}' in the pools offered to tenant ${tenantId}; see capacity list`,
    );
  }
  return rows[0];
}

/** The publication of one node (see publicationOf), read in `db` (a transaction that locked it: exact). */
export async function readHostPublication(db: Db | Trx, nodeId: string): Promise<HostPublication | null> {
  const [row] = await readHostPublicationRows(db as Db, [nodeId]);
  return row ? publicationOf(row) : null;
}

interface HoldRow {
  id: string;
  tenant_id: string;
  pool_id: string;
  node_id: string;
  node_name: string;
  kind: string;
  holder: string;
  cpu_cores: string;
  ram_gib: string;
  vram_gib: string;
  ttl_seconds: number;
  on_trust: boolean;
  acquired_at: Date;
  heartbeat_at: Date;
  released_at: Date | null;
  now: Date;
}

const holdColumns = sql`h.id, h.tenant_id, h.pool_id, h.node_id, n.name AS node_name, h.kind, h.holder, h.cpu_cores,
  h.ram_gib, h.vram_gib, h.ttl_seconds, h.on_trust, h.acquired_at, h.heartbeat_at, h.released_at, compute_now() AS now`;

/** A stored hold as the API shows it, its state at the row's compute_now(). */
export function holdViewOf(r: HoldRow): HoldView {
  const heartbeatAt = r.heartbeat_at.getTime();
  const releasedAt = r.released_at?.getTime() ?? null;
  const lapse = heartbeatAt + r.ttl_seconds * 1000;
  const state = holdStateAt({ releasedAt, heartbeatAt, ttlSeconds: r.ttl_seconds }, r.now.getTime());
  return {
    id: r.id,
    tenantId: r.tenant_id,
    poolId: r.pool_id,
    nodeId: r.node_id,
    target: r.node_name,
    kind: r.kind,
    holder: r.holder,
    cpuCores: Number(r.cpu_cores),
    ramGiB: Number(r.ram_gib),
    vramGiB: Number(r.vram_gib),
    ttlSeconds: r.ttl_seconds,
    state,
    onTrust: r.on_trust,
    acquiredAt: r.acquired_at.getTime(),
    heartbeatAt,
    expiresAt: releasedAt !== null ? Math.min(releasedAt, lapse) : lapse,
    endedAt: state === 'released' ? releasedAt : state === 'expired' ? lapse : null,
  };
}

async function readHold(
  db: Db | Trx,
  where: ReturnType<typeof sql>,
  lock = false,
): Promise<HoldRow | undefined> {
  const { rows } = await sql<HoldRow>`
    SELECT ${holdColumns} FROM host_holds h JOIN nodes n ON n.id = h.node_id WHERE ${where}
    ${lock ? sql`FOR UPDATE OF h` : sql``}`.execute(db);
  return rows[0];
}

/** The tenant's hold with this idempotency key of this identity, if one was taken. Read-only. */
export async function findHoldByKey(
  db: Db,
  input: { tenantId: string; identityId: string; idempotencyKey: string },
): Promise<HoldView | null> {
  const row = await readHold(
    db,
    sql`h.tenant_id = ${input.tenantId} AND h.owner_identity_id = ${input.identityId}
        AND h.idempotency_key = ${input.idempotencyKey}`,
  );
  return row ? holdViewOf(row) : null;
}

export type TakeHoldOutcome =
  | { taken: true; hold: HoldView; publication: HostPublication | null }
  | { taken: false; refusal: HoldRefusal; publication: HostPublication | null };

function isGuardRefusal(error: unknown): boolean {
  const code = (error as { code?: unknown } | null)?.code;
  return code === 'BC001';
}

/**
 * Takes a hold of `kind` on the node, in the caller's transaction: serialized per node (an
 * advisory lock, then the node's memory and vCPU rows in the order every booking locks them), the
 * kind's declaration read, the node's publication read under those locks and judged (judgeHold);
 * a node without a fresh publication is taken on trust. A hold books its cores and GiB as
 * hold_bookings over [now, now + TTL), refereed by the same guard as reservations' scalar
 * bookings, so a concurrent reservation can never take the same room. A taken hold writes its
 * `hold.created` event and its audit row (`audit`); a refusal writes only its ledger row (once per
 * `dedupeKey`). Ended holds of the node older than an hour are retired in the same transaction
 * (their `hold.expired` written first when the sweep has not yet). Codes: none thrown for refusals
 * (they are answered); INTERNAL otherwise.
 */
export async function takeHold(
  trx: Trx,
  input: {
    tenantId: string;
    identityId: string;
    target: HoldTarget;
    kind: string;
    holder: string;
    idempotencyKey?: string | undefined;
    ttlSeconds?: number | undefined;
    dedupeKey: string;
    audit: CallerAudit;
  },
): Promise<TakeHoldOutcome> {
  const { target } = input;
  await sql`SELECT pg_advisory_xact_lock(${holdLockSpace}, hashtext(${target.id}))`.execute(trx);
  for (const [resource] of bookedResources) {
    await sql`SELECT 1 FROM host_resources WHERE node_id = ${target.id} AND resource = ${resource} FOR UPDATE`.execute(
      trx,
    );
  }
  await announceExpiredHolds(trx, { nodeId: target.id, limit: 1_000 });
  await retireEndedHolds(trx, { nodeId: target.id });
  const refuse = async (refusal: HoldRefusal, kind: HoldKind | null, publication: HostPublication | null) => {
    await recordUnmetDemand(trx, {
      dedupeKey: input.dedupeKey,
      tenantId: input.tenantId,
      poolId: target.pool_id,
      source: 'hold',
      subjectId: target.id,
      shape: kind ? holdShape(kind) : undeclaredHoldShape(input.kind),
      kind: input.kind,
      reason: refusal.reason,
      message: refusal.message,
    });
    return { taken: false as const, refusal, publication };
  };
  const kind = await findHoldKind(trx, target.pool_id, input.kind);
  const publication = await readHostPublication(trx, target.id);
  if (!kind) return refuse(noKindRefusal(input.kind, target.pool_id), null, publication);
  const onTrust = !publication?.fresh;
  if (!onTrust) {
    const refusal = judgeHold(target.name, kind, publication!);
    if (refusal) return refuse(refusal, kind, publication);
  }
  const id = newId('hold');
  const ttl = input.ttlSeconds ?? kind.ttlSeconds ?? defaultHoldTtlSeconds;
  await sql`
    INSERT INTO host_holds (id, tenant_id, pool_id, node_id, kind, holder, owner_identity_id, idempotency_key,
                            cpu_cores, ram_gib, vram_gib, ttl_seconds, on_trust)
    VALUES (${id}, ${input.tenantId}, ${target.pool_id}, ${target.id}, ${kind.name}, ${input.holder}, ${input.identityId},
            ${input.idempotencyKey ?? null}, ${kind.cpuCores}, ${kind.ramGiB}, ${kind.vramGiB}, ${ttl}, ${onTrust})`.execute(
    trx,
  );
  await sql`SAVEPOINT hold_bookings`.execute(trx);
  try {
    // Only the resources the host has rows for: a host that never reported them is taken on trust.
    await sql`
      INSERT INTO hold_bookings (hold_id, node_id, resource, amount, during)
      SELECT ${id}, ${target.id}, r.resource, r.amount,
             tstzrange(compute_now(), compute_now() + make_interval(secs => ${ttl}), '[)')
      FROM (VALUES ('memoryGiB', ${kind.ramGiB}::numeric, 1), ('vcpu', ${kind.cpuCores}::numeric, 2)) AS r(resource, amount, ord)
      WHERE r.amount > 0
        AND EXISTS (SELECT 1 FROM host_resources h WHERE h.node_id = ${target.id} AND h.resource = r.resource)
      ORDER BY r.ord`.execute(trx);
  } catch (error) {
    if (!isGuardRefusal(error)) throw error;
    // A reservation booked a window that starts within the hold's TTL: the guard is the truth.
    await sql`ROLLBACK TO SAVEPOINT hold_bookings`.execute(trx);
    await sql`DELETE FROM host_holds WHERE id = ${id}`.execute(trx);
    const now = await readHostPublication(trx, target.id);
    return refuse(lostRaceRefusal(target.name, kind, now!), kind, now);
  }
  const hold = holdViewOf((await readHold(trx, sql`h.id = ${id}`))!);
  await recordHoldChange(trx, hold, 'hold.created', input.audit);
  return { taken: true, hold, publication: await readHostPublication(trx, target.id) };
}

/**
 * Writes `hold.expired` once for every hold that lapsed without a release (no heartbeat within
 * its TTL), on `nodeId` when given, at most `limit` a call, in the caller's transaction; the
 * holds are locked first (a concurrent sweep skips them), so each expiry is announced exactly
 * once. Answers the ids announced. Codes: none.
 */
export async function announceExpiredHolds(
  trx: Trx,
  input: { nodeId?: string | undefined; limit: number },
): Promise<string[]> {
  const ids = await lockUnannouncedExpiries(trx, input);
  for (const id of ids) {
    await recordHoldChange(trx, holdViewOf((await readHold(trx, sql`h.id = ${id}`))!), 'hold.expired');
  }
  return ids;
}

/**
 * Retires the ended holds (on `nodeId` when given) older than the hour they stay listed for;
 * their bookings go with them. Run it after announceExpiredHolds in the same transaction, so no
 * expiry goes unannounced. Answers how many. Idempotent.
 */
export async function retireEndedHolds(db: Db | Trx, input: { nodeId?: string | undefined } = {}) {
  const result = await sql`
    DELETE FROM host_holds WHERE ${input.nodeId ? sql`node_id = ${input.nodeId}` : sql`true`}
      AND COALESCE(released_at, heartbeat_at + make_interval(secs => ttl_seconds))
          < compute_now() - make_interval(secs => ${endedHoldVisibleMs / 1000})`.execute(db);
  return Number(result.numAffectedRows ?? 0);
}

/**
 * Heartbeats a live hold of the tenant: heartbeat_at and the end of its bookings move to
 * compute_now() + TTL, under the booking guard. Codes: NOT_FOUND (no such hold of the tenant),
 * INVALID_STATE (released or expired: take a new hold), CAPACITY_UNAVAILABLE (a reservation
 * booked the room from the hold's current end on).
 */
export async function heartbeatHold(
  trx: Trx,
  input: { tenantId: string; holdId: string },
): Promise<HoldView> {
  const row = await readHold(trx, sql`h.id = ${input.holdId} AND h.tenant_id = ${input.tenantId}`, true);
  if (!row)
    throw new ComputeError('NOT_FOUND', `holdId: tenant ${input.tenantId} has no hold ${input.holdId}`);
  const view = holdViewOf(row);
  if (view.state !== 'live') {
    throw new ComputeError(
      'INVALID_STATE',
      `hold ${view.id} ${view.state === 'released' ? 'was released' : 'expired (no heartbeat within its TTL)'} at ${new Date(view.endedAt!).toISOString()}; take a new hold`,
      { holdId: view.id, state: view.state },
    );
  }
  await sql`UPDATE host_holds SET heartbeat_at = compute_now() WHERE id = ${row.id}`.execute(trx);
  try {
    await sql`
      UPDATE hold_bookings SET during = tstzrange(lower(during), compute_now() + make_interval(secs => ${row.ttl_seconds}), '[)')
      WHERE hold_id = ${row.id}`.execute(trx);
  } catch (error) {
    if (!isGuardRefusal(error)) throw error;
    throw new ComputeError(
      'CAPACITY_UNAVAILABLE',
      `hold ${row.id} cannot be extended on ${row.node_name}: a reservation booked its room from ${new Date(view.expiresAt).toISOString()} on; release it and take a hold on another host`,
      { holdId: row.id, nodeId: row.node_id },
    );
  }
  return holdViewOf((await readHold(trx, sql`h.id = ${row.id}`))!);
}

/**
 * Releases a hold of the tenant: released_at = compute_now() and its bookings removed, so the room
 * comes back at once; a live hold released writes `hold.released` and its audit row (`audit`).
 * Idempotent: an ended hold is answered as it is, and writes nothing more. Codes: NOT_FOUND.
 */
export async function releaseHold(
  trx: Trx,
  input: { tenantId: string; holdId: string; audit: CallerAudit },
): Promise<HoldView> {
  const row = await readHold(trx, sql`h.id = ${input.holdId} AND h.tenant_id = ${input.tenantId}`, true);
  if (!row)
    throw new ComputeError('NOT_FOUND', `holdId: tenant ${input.tenantId} has no hold ${input.holdId}`);
  const live = holdViewOf(row).state === 'live';
  if (live) {
    await sql`UPDATE host_holds SET released_at = compute_now() WHERE id = ${row.id}`.execute(trx);
  }
  await sql`DELETE FROM hold_bookings WHERE hold_id = ${row.id}`.execute(trx);
  const released = holdViewOf((await readHold(trx, sql`h.id = ${row.id}`))!);
  if (live) await recordHoldChange(trx, released, 'hold.released', input.audit);
  return released;
}

/** One hold of the tenant (live or ended within the hour), or NOT_FOUND. Read-only. */
export async function getHold(db: Db, input: { tenantId: string; holdId: string }): Promise<HoldView> {
  const row = await readHold(
    db,
    sql`h.id = ${input.holdId} AND h.tenant_id = ${input.tenantId} AND ${visible}`,
  );
  if (!row)
    throw new ComputeError('NOT_FOUND', `holdId: tenant ${input.tenantId} has no hold ${input.holdId}`);
  return holdViewOf(row);
}

/** Live, or ended less than an hour ago. */
const visible = sql`COALESCE(h.released_at, h.heartbeat_at + make_interval(secs => h.ttl_seconds))
  >= compute_now() - make_interval(secs => ${endedHoldVisibleMs / 1000})`;
const live = sql`h.released_at IS NULL AND h.heartbeat_at + make_interval(secs => h.ttl_seconds) > compute_now()`;

/**
 * The holds a tenant may see (its own, and every hold on the nodes of the pools it owns), on
 * `nodeIds` when given: live ones, and with `includeEnded` those ended within the last hour,
 * newest first, at most 1,000. Read-only.
 */
export async function listHolds(
  db: Db,
  input: { tenantId: string; nodeIds?: readonly string[] | undefined; includeEnded: boolean },
): Promise<HoldView[]> {
  const { rows } = await sql<HoldRow>`
    SELECT ${holdColumns} FROM host_holds h JOIN nodes n ON n.id = h.node_id JOIN pools p ON p.id = h.pool_id
    WHERE (h.tenant_id = ${input.tenantId} OR p.owner_tenant_id = ${input.tenantId})
      AND ${input.nodeIds ? sql`h.node_id = ANY(${input.nodeIds as string[]}::text[])` : sql`true`}
      AND ${input.includeEnded ? visible : live}
    ORDER BY h.acquired_at DESC, h.id DESC
    LIMIT 1000`.execute(db);
  return rows.map(holdViewOf);
}
