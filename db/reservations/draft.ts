import { sql, type Transaction } from 'kysely';
import type { AdmissionCaches, PoolForTenant } from '../../core/admission-caches.ts';
import type { Database, Db, Reservation } from '../../core/database.ts';
import type { Principal } from '../../core/iam-port.ts';
import { ComputeError } from '../../domain/errors.ts';
import type { PoolSharingMode } from '../../domain/fleet.ts';
import { reservationDraftId } from '../../domain/ids.ts';
import { calendarHorizonDays, readPoolPolicy } from '../../domain/pool-policy.ts';
import {
  authzAttributes,
  type HostResourceAmounts,
  type NormalizedRequest,
  startOutOfHorizon,
} from '../../domain/reservation-request.ts';
import { atomWorth } from '../../domain/sharing.ts';
import { resolveMachineLeaseRequest } from '../metal/dedicated-admission.ts';
import { insertDraftSoon } from './draft-insert.ts';

type Trx = Transaction<Database>;

export type { PoolForTenant };

/**
 * poolForTenant through `caches.pools` (5 s, positive answers only) when given: what admission
 * reads to validate and describe a new draft. The draft's insert re-checks the offer in the same
 * statement, so a stale entry can never admit a draft on a pool that is no longer offered.
 */
export async function cachedPoolForTenant(
  db: Db,
  tenantId: string,
  poolId: string,
  caches?: AdmissionCaches,
): Promise<PoolForTenant> {
  if (!caches) return poolForTenant(db, tenantId, poolId);
  return caches.pools.load(`${tenantId}\u0000${poolId}`, () => poolForTenant(db, tenantId, poolId));
}

/** The pool if it is owned by or offered to the tenant and not archived; else NOT_FOUND. */
export async function poolForTenant(trx: Trx | Db, tenantId: string, poolId: string) {
  const { rows } = await sql<PoolForTenant>`
    SELECT p.id, p.owner_tenant_id, p.gpu_model, p.sharing_mode, p.policy, s.region, o.on_budget_exceeded
    FROM pools p JOIN sites s ON s.id = p.site_id
    LEFT JOIN pool_offers o ON o.pool_id = p.id AND o.tenant_id = ${tenantId}
    WHERE p.id = ${poolId} AND p.archived_at IS NULL AND (p.owner_tenant_id = ${tenantId} OR o.tenant_id IS NOT NULL)`.execute(
    trx,
  );
  const pool = rows[0];
  if (!pool)
    throw new ComputeError('NOT_FOUND', `poolId: pool ${poolId} is not offered to tenant ${tenantId}`);
  return pool;
}

/**
 * The pool's per-GPU share of host CPU and memory: `policy.perGpu` where set, otherwise the
 * smallest share any GPU host of the pool can give (allocatable ÷ physical GPUs), so it fits on
 * every host. The measured share goes through `caches.share` (30 s per pool) when given.
 */
export async function poolPerGpuShare(
  db: Db,
  pool: { id: string; policy: Record<string, unknown> },
  caches?: AdmissionCaches,
): Promise<HostResourceAmounts> {
  const perGpu = (pool.policy.perGpu ?? {}) as Partial<HostResourceAmounts>;
  const measure = async () => {
    const { rows } = await sql<{ resource: string; share: string | null }>`
      SELECT h.resource, min(h.allocatable / g.n) AS share
      FROM nodes n
      JOIN LATERAL (SELECT count(*) AS n FROM devices d
                    WHERE d.node_id = n.id AND d.class = 'gpu' AND d.removed_at IS NULL) g ON g.n > 0
      JOIN host_resources h ON h.node_id = n.id AND h.resource IN ('vcpu', 'memoryGiB')
      WHERE n.pool_id = ${pool.id}
      GROUP BY h.resource`.execute(db);
    const share = { vcpu: 0, memoryGiB: 0, hugepages1Gi: 0 };
    for (const r of rows) share[r.resource as 'vcpu' | 'memoryGiB'] = Number(r.share ?? 0);
    return share;
  };
  const measured = caches ? await caches.share.load(pool.id, measure) : await measure();
  return {
    vcpu: perGpu.vcpu ?? measured.vcpu,
    memoryGiB: perGpu.memoryGiB ?? measured.memoryGiB,
    hugepages1Gi: 0,
  };
}

const classForSharing: Record<string, string> = {
  exclusive: 'gpu',
  mig: 'gpu.mig',
  'time-slice': 'gpu.slot',
  mps: 'gpu.slot',
};

/** Checks what the pool allows and resolves the host resources the request books (share as floor). */
export async function resolveRequestForPool(
  db: Trx | Db,
  tenantId: string,
  pool: PoolForTenant,
  request: NormalizedRequest,
  caches?: AdmissionCaches,
): Promise<{ request: NormalizedRequest; booked: HostResourceAmounts; share: HostResourceAmounts }> {
  const device = request.devices[0]!;
  const expected = classForSharing[pool.sharing_mode] ?? 'gpu';
  if (device.class !== expected) {
    throw new ComputeError(
      'INVALID_INPUT',
      `devices[0].class: pool ${pool.id} shares GPUs as ${pool.sharing_mode}; ask for class ${expected}`,
    );
  }
  if (device.topology === 'nvlink-all' && device.class !== 'gpu') {
    throw new ComputeError(
      'INVALID_INPUT',
      "devices[0].topology: 'nvlink-all' is for whole GPUs (class gpu)",
    );
  }
  if (request.binding === 'kubernetes' && (!pool.policy.kubernetes || pool.owner_tenant_id !== tenantId)) {
    throw new ComputeError(
      'INVALID_INPUT',
      pool.policy.kubernetes
        ? `binding: only the owner of pool ${pool.id} may book it for kubernetes; book a hold instead`
        : `binding: pool ${pool.id} has no policy.kubernetes; book a hold instead`,
    );
  }
  if (request.binding === 'node') {
    // Whole machines: the placer books every atom and host resource of each (db/metal/dedicated-placement.ts).
    const none = { vcpu: 0, memoryGiB: 0, hugepages1Gi: 0 };
    return {
      request: await resolveMachineLeaseRequest(db, tenantId, pool, request),
      booked: none,
      share: none,
    };
  }
  const perGpu = await poolPerGpuShare(db, { id: pool.id, policy: pool.policy }, caches);
  // One definition of what a shared atom is worth (domain/sharing.ts), here its host share.
  const equivalent = atomWorth({
    deviceClass: device.class,
    mode: pool.sharing_mode as PoolSharingMode,
    policy: pool.policy,
    profile:
      typeof device.selector?.attributes?.profile === 'string'
        ? device.selector.attributes.profile
        : undefined,
  }).hostShare;
  const share = {
    vcpu: Math.floor(perGpu.vcpu * device.count * equivalent),
    memoryGiB: Math.floor(perGpu.memoryGiB * device.count * equivalent),
    hugepages1Gi: 0,
  };
  const booked = {
    vcpu: Math.max(request.resources?.vcpu ?? 0, share.vcpu),
    memoryGiB: Math.max(request.resources?.memoryGiB ?? 0, share.memoryGiB),
    hugepages1Gi: request.resources?.hugepages1Gi ?? 0,
  };
  return { request: { ...request, resources: booked }, booked, share };
}

export type DraftResult =
  | { kind: 'existing'; row: Reservation }
  | {
      kind: 'created';
      row: Reservation;
      attributes: Record<string, unknown>;
      pool: PoolForTenant;
      /** compute_now() as the insert read it, in epoch ms. */
      now: number;
    };

/**
 * Transaction 1, as one statement (atomic on its own, so no BEGIN/COMMIT round trips; shared with
 * the drafts of concurrent creates, see insertDraftSoon): the pool's
 * offer and the requested start's horizon (at most the pool's calendar.horizonDays ahead, default
 * 90, at most 5 minutes past, by
 * compute_now()) re-checked, the draft inserted with its deterministic id and its authz projection
 * row (the seed's attributes), parented to the pool and owned by the caller. A key already taken
 * inserts nothing (a concurrent first call waits for the other to commit) and answers the stored
 * row, touching a draft's `updated_at` (its retention starts over with each retry); a different
 * request under that key is CONFLICT with details.reservationId. INVALID_INPUT naming `start` (and
 * the bound) for a new request outside the horizon; NOT_FOUND for a pool not offered.
 */
export async function writeDraft(
  db: Db,
  input: {
    tenantId: string;
    principal: Principal;
    idempotencyKey: string;
    request: NormalizedRequest;
    hash: string;
  },
  caches?: AdmissionCaches,
): Promise<DraftResult> {
  const id = reservationDraftId(input.tenantId, input.principal.identityId, input.idempotencyKey);
  const repeated = async (): Promise<DraftResult | null> => {
    const { rows } = await sql<Reservation>`
      WITH touched AS (
        UPDATE reservations SET updated_at = compute_now()
        WHERE id = ${id} AND state = 'draft' AND request_hash = ${input.hash}
        RETURNING *
      )
      SELECT * FROM touched
      UNION ALL
      SELECT * FROM reservations WHERE id = ${id} AND NOT EXISTS (SELECT 1 FROM touched)`.execute(db);
    const existing = rows[0];
    if (!existing) return null;
    if (existing.request_hash !== input.hash) {
      throw new ComputeError(
        'CONFLICT',
        `idempotencyKey: '${input.idempotencyKey}' was already used for a different request; use a new key`,
        { reservationId: id },
      );
    }
    return { kind: 'existing', row: existing };
  };
  let pool: PoolForTenant;
  try {
    pool = await cachedPoolForTenant(db, input.tenantId, input.request.poolId, caches);
  } catch (error) {
    // A repeated key still answers its stored reservation after its pool went away.
    const found = await repeated();
    if (found) return found;
    throw error;
  }
  const { request, booked, share } = await resolveRequestForPool(
    db,
    input.tenantId,
    pool,
    input.request,
    caches,
  );
  const attributes = authzAttributes({
    request,
    gpuModel: pool.gpu_model,
    region: pool.region,
    resources: booked,
  });
  // The pool's calendar horizon (policy calendar.horizonDays, default 90 days).
  const horizonDays = calendarHorizonDays(readPoolPolicy(pool.policy));
  const result = await insertDraftSoon(db, {
    id,
    tenantId: input.tenantId,
    poolId: pool.id,
    ownerIdentityId: input.principal.identityId,
    idempotencyKey: input.idempotencyKey,
    request,
    hash: input.hash,
    horizonMs: horizonDays * 86_400_000,
    share,
    attributes,
  });
  if (result.row) return { kind: 'created', row: result.row, attributes, pool, now: result.checkedAt };
  const found = await repeated();
  if (found) return found;
  if (!result.offered) {
    caches?.pools.clear();
    throw new ComputeError('NOT_FOUND', `poolId: pool ${pool.id} is not offered to tenant ${input.tenantId}`);
  }
  // In whole milliseconds on both sides, so startOutOfHorizon judges exactly as the insert did.
  const outside =
    request.start !== undefined && startOutOfHorizon(request.start, result.checkedAt, horizonDays);
  if (!result.inHorizon && outside) throw outside;
  throw new ComputeError('INTERNAL', `reservation ${id} could be neither inserted nor found`);
}
