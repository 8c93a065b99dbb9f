import { type RawBuilder, sql, type Transaction } from 'kysely';
import type { Database, Db, Reservation } from '../../core/database.ts';
import { ComputeError } from '../../domain/errors.ts';
import type { HostResourceAmounts, NormalizedRequest } from '../../domain/reservation-request.ts';
import { preparedMarker } from '../pool.ts';
import { parseStoredHostShare, parseStoredRequest } from './stored.ts';

type Trx = Transaction<Database>;

/**
 * What a request charges: its atoms by class (`gpu`, `gpu.mig`, `gpu.slot`), and only the host
 * resources booked above the pool's per-GPU share (`vcpu`, `memoryGiB`; 1 GiB huge pages count as
 * memory). The share rides on the GPUs. A gang asks for all of it on each of its nodes, so it
 * charges everything times its size (one charge for the whole gang).
 */
export function quotaNeeds(
  request: NormalizedRequest,
  booked: HostResourceAmounts,
  share: HostResourceAmounts,
): Record<string, number> {
  const needs: Record<string, number> = {};
  const members = request.gang?.size ?? 1;
  for (const d of request.devices) needs[d.class] = (needs[d.class] ?? 0) + d.count * members;
  const vcpu = (booked.vcpu - share.vcpu) * members;
  const memory = (booked.memoryGiB + booked.hugepages1Gi - share.memoryGiB) * members;
  if (vcpu > 0) needs.vcpu = vcpu;
  if (memory > 0) needs.memoryGiB = memory;
  return needs;
}

/** What a stored reservation charges (quotaNeeds of its stored request and host share). */
export function storedQuotaNeeds(
  row: Pick<Reservation, 'id' | 'request' | 'host_share'>,
): Record<string, number> {
  const request = parseStoredRequest(row.id, row.request);
  const booked = {
    vcpu: request.resources?.vcpu ?? 0,
    memoryGiB: request.resources?.memoryGiB ?? 0,
    hugepages1Gi: request.resources?.hugepages1Gi ?? 0,
  };
  return quotaNeeds(request, booked, parseStoredHostShare(row.id, row.host_share));
}

function exceeded(resource: string, requested: number, limit: number, used: number) {
  return new ComputeError(
    'QUOTA_EXCEEDED',
    `quota for ${resource} is exhausted: ${used} of ${limit} used, this request needs ${requested}; release a reservation or ask for more quota, then retry with the same idempotency key`,
    { resource, requested, limit, used },
  );
}

/** The same check from the free amounts read with the reservation's lock (no extra round trip). */
export function precheckQuotaFree(
  needs: Record<string, number>,
  quota: Record<string, { limit: number | string; used: number | string }> | null,
): void {
  for (const resource of Object.keys(needs).sort()) {
    const limit = Number(quota?.[resource]?.limit ?? 0);
    const used = Number(quota?.[resource]?.used ?? 0);
    if (used + needs[resource]! > limit) throw exceeded(resource, needs[resource]!, limit, used);
  }
}

/** The tenant's quota rows in a pool, every resource (a resource without a row grants zero). Read-only. */
export async function readTenantQuotas(db: Db, tenantId: string, poolId: string) {
  return db
    .selectFrom('quotas')
    .selectAll()
    .where('tenant_id', '=', tenantId)
    .where('pool_id', '=', poolId)
    .execute();
}

/** A read-only check (no locks) so a request sure to exceed its quota is refused before placement. */
export async function precheckQuota(
  db: Db,
  input: { tenantId: string; poolId: string; needs: Record<string, number> },
): Promise<void> {
  const resources = Object.keys(input.needs);
  if (resources.length === 0) return;
  const rows = await db
    .selectFrom('quotas')
    .select(['resource', 'limit_amount', 'used'])
    .where('tenant_id', '=', input.tenantId)
    .where('pool_id', '=', input.poolId)
    .where('resource', 'in', resources)
    .execute();
  for (const resource of resources.sort()) {
    const row = rows.find((r) => r.resource === resource);
    const limit = Number(row?.limit_amount ?? 0);
    const used = Number(row?.used ?? 0);
    if (used + input.needs[resource]! > limit) throw exceeded(resource, input.needs[resource]!, limit, used);
  }
}

/**
 * One resource's charge as CTEs (`already`, `up`, `charge`) of a larger statement: the guarded
 * UPDATE (`used + amount <= limit`, only `when` holds) and its quota_charges row; a reservation
 * already charged for the resource (an unrefunded row) is not charged again. `charged` is true
 * over them when the charge was made or had been.
 */
export function quotaChargeCtes(
  input: { reservationId: string; tenantId: string; poolId: string; resource: string; amount: number },
  when: RawBuilder<boolean> = sql<boolean>`true`,
): { ctes: RawBuilder<unknown>; charged: RawBuilder<boolean> } {
  const { reservationId, tenantId, poolId, resource, amount } = input;
  return {
    ctes: sql`already AS (
        SELECT 1 FROM quota_charges WHERE reservation_id = ${reservationId} AND resource = ${resource}
          AND refunded_at IS NULL
      ), up AS (
        UPDATE quotas SET used = used + ${amount}::numeric
        WHERE tenant_id = ${tenantId} AND pool_id = ${poolId} AND resource = ${resource}
          AND used + ${amount}::numeric <= limit_amount AND NOT EXISTS (SELECT 1 FROM already) AND ${when}
        RETURNING 1
      ), charge AS (
        INSERT INTO quota_charges (reservation_id, tenant_id, pool_id, resource, amount)
        SELECT ${reservationId}, ${tenantId}, ${poolId}, ${resource}, ${amount} FROM up
        ON CONFLICT (reservation_id, resource) DO UPDATE
          SET amount = EXCLUDED.amount, refunded_at = NULL, charged_at = compute_now()
        RETURNING 1
      )`,
    charged: sql<boolean>`(EXISTS (SELECT 1 FROM charge) OR EXISTS (SELECT 1 FROM already))`,
  };
}

/** QUOTA_EXCEEDED for a charge that was refused, with the quota row as it is now. */
export async function quotaRefusal(
  db: Trx | Db,
  input: { tenantId: string; poolId: string; resource: string; amount: number },
): Promise<ComputeError> {
  const row = await db
    .selectFrom('quotas')
    .select(['limit_amount', 'used'])
    .where('tenant_id', '=', input.tenantId)
    .where('pool_id', '=', input.poolId)
    .where('resource', '=', input.resource)
    .executeTakeFirst();
  return exceeded(input.resource, input.amount, Number(row?.limit_amount ?? 0), Number(row?.used ?? 0));
}

/**
 * Charges a reservation's quota all or nothing, once: each resource is one guarded UPDATE
 * (`used + amount <= limit`) in resource order, recorded in quota_charges; a reservation already
 * charged is not charged again. QUOTA_EXCEEDED (a missing row grants zero) leaves the caller's
 * transaction to roll back. Callers run this last in their transaction so the quota row locks are
 * held only until commit.
 */
export async function chargeQuota(
  trx: Trx,
  input: { reservationId: string; tenantId: string; poolId: string; needs: Record<string, number> },
): Promise<void> {
  for (const resource of Object.keys(input.needs).sort()) {
    const amount = input.needs[resource]!;
    if (amount <= 0) continue;
    // One round trip: the guarded update and its charge row.
    const charge = quotaChargeCtes({ ...input, resource, amount });
    const { rows } = await sql<{ charged: boolean }>`${sql.raw(preparedMarker)}
      WITH ${charge.ctes}
      SELECT ${charge.charged} AS charged`.execute(trx);
    if (!rows[0]?.charged) throw await quotaRefusal(trx, { ...input, resource, amount });
  }
}
