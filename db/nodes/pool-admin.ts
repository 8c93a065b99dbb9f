import { sql, type Transaction } from 'kysely';
import type { Database, Db } from '../../core/database.ts';
import type { PoolPolicy } from '../../domain/pool-policy.ts';
import { insertAuditEvent } from '../events/audit.ts';

type Trx = Transaction<Database>;

/** Who changes a pool, for the audit row. */
export interface PoolAdminActor {
  tenantId: string;
  identityId: string;
  requestId: string;
  context: Record<string, unknown>;
}

const poolResource = 'compute-pool';

/**
 * Replaces a pool's policy and raises its version, with an audit row holding the new document,
 * the previous one and both versions, in the caller's transaction (the pool row locked). With
 * `expectedVersion` the change applies only on that version, else `conflict` names the current one.
 * Null when there is no such pool. Not idempotent: every call is a new version.
 */
export async function replacePoolPolicy(
  trx: Trx,
  input: { poolId: string; policy: PoolPolicy; expectedVersion?: number | undefined; actor: PoolAdminActor },
): Promise<
  { outcome: 'updated'; version: number; archived: boolean } | { outcome: 'conflict'; version: number } | null
> {
  const row = await trx
    .selectFrom('pools')
    .select(['policy', 'policy_version', 'archived_at'])
    .where('id', '=', input.poolId)
    .forNoKeyUpdate()
    .executeTakeFirst();
  if (!row) return null;
  if (input.expectedVersion !== undefined && input.expectedVersion !== row.policy_version) {
    return { outcome: 'conflict', version: row.policy_version };
  }
  const version = row.policy_version + 1;
  await trx
    .updateTable('pools')
    .set({ policy: JSON.stringify(input.policy), policy_version: version })
    .where('id', '=', input.poolId)
    .execute();
  await insertAuditEvent(trx, {
    tenantId: input.actor.tenantId,
    actorIdentityId: input.actor.identityId,
    action: 'compute:admin:set-pool-policy',
    resourceType: poolResource,
    resourceId: input.poolId,
    requestId: input.actor.requestId,
    context: {
      ...input.actor.context,
      version,
      previousVersion: row.policy_version,
      policy: input.policy,
      previousPolicy: row.policy,
    },
  });
  return { outcome: 'updated', version, archived: row.archived_at !== null };
}

/** One version of a pool's policy as its audit row recorded it. */
export interface PoolPolicyVersion {
  version: number;
  policy: Record<string, unknown>;
  changedAt: number;
  changedBy: string | null;
  requestId: string | null;
}

/** Every recorded change of a pool's policy, newest first (at most 100). */
export async function listPoolPolicyVersions(db: Db, poolId: string): Promise<PoolPolicyVersion[]> {
  const rows = await db
    .selectFrom('audit_events')
    .select(['at', 'actor_identity_id', 'request_id', 'context'])
    .where('resource_type', '=', poolResource)
    .where('resource_id', '=', poolId)
    .where('action', '=', 'compute:admin:set-pool-policy')
    .orderBy('id', 'desc')
    .limit(100)
    .execute();
  return rows.map((r) => {
    const context = (typeof r.context === 'string' ? JSON.parse(r.context) : r.context) as {
      version: number;
      policy: Record<string, unknown>;
    };
    return {
      version: context.version,
      policy: context.policy,
      changedAt: new Date(r.at).getTime(),
      changedBy: r.actor_identity_id,
      requestId: r.request_id,
    };
  });
}

/**
 * Archives a pool at compute_now(), with its audit row: from then on it admits nothing, and its
 * pending and placed reservations fail (`Unschedulable`/`PoolGone`) at their lifecycle's next look.
 * Idempotent: an archived pool keeps its first archive time (`changed: false`). Null when there is
 * no such pool.
 */
export async function archivePool(
  trx: Trx,
  input: { poolId: string; reason?: string | undefined; actor: PoolAdminActor },
): Promise<{ changed: boolean; archivedAt: number } | null> {
  const row = await trx
    .selectFrom('pools')
    .select(['archived_at'])
    .where('id', '=', input.poolId)
    .forNoKeyUpdate()
    .executeTakeFirst();
  if (!row) return null;
  if (row.archived_at !== null) return { changed: false, archivedAt: new Date(row.archived_at).getTime() };
  const updated = await trx
    .updateTable('pools')
    .set({ archived_at: sql<Date>`compute_now()` })
    .where('id', '=', input.poolId)
    .returning('archived_at')
    .executeTakeFirstOrThrow();
  await insertAuditEvent(trx, {
    tenantId: input.actor.tenantId,
    actorIdentityId: input.actor.identityId,
    action: 'compute:admin:archive-pool',
    resourceType: poolResource,
    resourceId: input.poolId,
    requestId: input.actor.requestId,
    context: { ...input.actor.context, ...(input.reason ? { reason: input.reason } : {}) },
  });
  return { changed: true, archivedAt: new Date(updated.archived_at!).getTime() };
}

/**
 * Withdraws a pool's offer to a tenant, with its audit row: the tenant can no longer book the pool
 * (admission answers NOT_FOUND), and its pending and placed reservations there fail
 * (`Unschedulable`/`PoolGone`); active ones run to their end and refund their quota then (the
 * quota rows stay). False when there was no such offer.
 */
export async function withdrawPoolOffer(
  trx: Trx,
  input: { poolId: string; tenantId: string; reason?: string | undefined; actor: PoolAdminActor },
): Promise<boolean> {
  const deleted = await trx
    .deleteFrom('pool_offers')
    .where('pool_id', '=', input.poolId)
    .where('tenant_id', '=', input.tenantId)
    .returning('tenant_id')
    .executeTakeFirst();
  if (!deleted) return false;
  await insertAuditEvent(trx, {
    tenantId: input.actor.tenantId,
    actorIdentityId: input.actor.identityId,
    action: 'compute:admin:withdraw-offer',
    resourceType: poolResource,
    resourceId: input.poolId,
    requestId: input.actor.requestId,
    context: {
      ...input.actor.context,
      offerTenantId: input.tenantId,
      ...(input.reason ? { reason: input.reason } : {}),
    },
  });
  return true;
}

/**
 * The reservations of a pool (of one tenant when given) that an archive or a withdrawn offer ends:
 * `pending` and `placed`, the states whose lifecycle fails them with `PoolGone`.
 */
export async function listPoolGoneCandidates(
  db: Db,
  input: { poolId: string; tenantId?: string },
): Promise<string[]> {
  let query = db
    .selectFrom('reservations')
    .select('id')
    .where('pool_id', '=', input.poolId)
    .where('state', 'in', ['pending', 'placed']);
  if (input.tenantId) query = query.where('tenant_id', '=', input.tenantId);
  const rows = await query.execute();
  return rows.map((r) => r.id);
}
