import { sql, type Transaction } from 'kysely';
import { ComputeError } from '../domain/errors.ts';
import type { HostResourceAmounts, NormalizedRequest } from '../domain/reservation-request.ts';
import type { Db } from './pool.ts';
import type { Database } from './schema.ts';

type Trx = Transaction<Database>;

/**
 * What a request charges: its atoms by class (`gpu`, `gpu.mig`, `gpu.slot`), and only the host
 * resources booked above the pool's per-GPU share (`vcpu`, `memoryGiB`; 1 GiB huge pages count as
 * memory). The share rides on the GPUs.
 */
export function quotaNeeds(
  request: NormalizedRequest,
  booked: HostResourceAmounts,
  share: HostResourceAmounts,
): Record<string, number> {
  const needs: Record<string, number> = {};
  for (const d of request.devices) needs[d.class] = (needs[d.class] ?? 0) + d.count;
  const vcpu = booked.vcpu - share.vcpu;
  const memory = booked.memoryGiB + booked.hugepages1Gi - share.memoryGiB;
  if (vcpu > 0) needs.vcpu = vcpu;
  if (memory > 0) needs.memoryGiB = memory;
  return needs;
}

function exceeded(resource: string, requested: number, limit: number, used: number) {
  return new ComputeError(
    'QUOTA_EXCEEDED',
    `quota for ${resource} is exhausted: ${used} of ${limit} used, this request needs ${requested}; release a reservation or ask for more quota, then retry with the same idempotency key`,
    { resource, requested, limit, used },
  );
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
  const already = await trx
    .selectFrom('quota_charges')
    .select('resource')
    .where('reservation_id', '=', input.reservationId)
    .where('refunded_at', 'is', null)
    .executeTakeFirst();
  if (already) return;
  for (const resource of Object.keys(input.needs).sort()) {
    const amount = input.needs[resource]!;
    if (amount <= 0) continue;
    const charged = await trx
      .updateTable('quotas')
      .set({ used: sql<string>`used + ${amount}::numeric` })
      .where('tenant_id', '=', input.tenantId)
      .where('pool_id', '=', input.poolId)
      .where('resource', '=', resource)
      .where(sql<boolean>`used + ${amount}::numeric <= limit_amount`)
      .returning('used')
      .executeTakeFirst();
    if (!charged) {
      const row = await trx
        .selectFrom('quotas')
        .select(['limit_amount', 'used'])
        .where('tenant_id', '=', input.tenantId)
        .where('pool_id', '=', input.poolId)
        .where('resource', '=', resource)
        .executeTakeFirst();
      throw exceeded(resource, amount, Number(row?.limit_amount ?? 0), Number(row?.used ?? 0));
    }
    await trx
      .insertInto('quota_charges')
      .values({
        reservation_id: input.reservationId,
        tenant_id: input.tenantId,
        pool_id: input.poolId,
        resource,
        amount,
      })
      .onConflict((oc) =>
        oc
          .columns(['reservation_id', 'resource'])
          .doUpdateSet({ amount, refunded_at: null, charged_at: sql`compute_now()` }),
      )
      .execute();
  }
}
