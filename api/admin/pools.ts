import { z } from 'zod';
import { admissionContext } from '../../db/events/audit.ts';
import { findPool } from '../../db/nodes/fleet.ts';
import {
  archivePool as archivePoolRow,
  listPoolGoneCandidates,
  listPoolPolicyVersions,
  type PoolAdminActor,
  replacePoolPolicy,
  withdrawPoolOffer,
} from '../../db/nodes/pool-admin.ts';
import { ComputeError } from '../../domain/errors.ts';
import { poolPolicySchema } from '../../domain/pool-policy.ts';
import { defineMethod, type MethodContext } from '../method.ts';
import { afterCommit } from '../reservations/access.ts';
import { requireRootAdmin } from './guard.ts';

const poolId = z.string().min(1).max(100);
const tenantId = z
  .string()
  .regex(/^[a-z0-9][a-z0-9_-]{0,62}$/, "a tenant id: lower-case letters, digits, '-' or '_'");
const reason = z.string().min(1).max(500);

function actor(ctx: MethodContext): PoolAdminActor {
  return {
    tenantId: ctx.principal.tenantId,
    identityId: ctx.principal.identityId,
    requestId: ctx.requestId,
    context: admissionContext(ctx.principal, ctx.requestId),
  };
}

function noPool(id: string): ComputeError {
  return new ComputeError('NOT_FOUND', `poolId: pool ${id} does not exist`);
}

/**
 * Wakes the lifecycles of the reservations a pool's archive or a withdrawn offer ends, so they fail
 * with PoolGone now rather than at their next timer (which catches any wake-up lost here).
 */
async function wakePoolGone(ctx: MethodContext, input: { poolId: string; tenantId?: string }) {
  const ids = await listPoolGoneCandidates(ctx.deps.db, input);
  if (ids.length === 0) return 0;
  await afterCommit(ctx, 'pool-gone', () =>
    Promise.all(ids.map((id) => ctx.deps.lifecycle?.signal(id, { type: 'wake', reason: 'pool-gone' }))),
  );
  return ids.length;
}

/** Admission's caches hold a pool's row for seconds: this process sees the change at once. */
function forgetCachedPools(ctx: MethodContext) {
  ctx.deps.caches?.pools.clear();
  ctx.deps.caches?.share.clear();
}

const setPoolPolicy = defineMethod({
  summary:
    "Replace a pool's policy (validated knob by knob); each change is a new version in the audit log and applies to decisions taken from now on. With expectedVersion, CONFLICT when the policy changed since.",
  action: 'compute:admin:write',
  input: z.strictObject({
    poolId,
    policy: poolPolicySchema,
    expectedVersion: z.number().int().min(1).max(2_147_483_647).optional(),
  }),
  output: z.object({
    poolId: z.string(),
    policy: z.record(z.string(), z.unknown()),
    policyVersion: z.number(),
    archived: z.boolean(),
  }),
  handler: async (ctx, input) => {
    await requireRootAdmin(ctx, 'compute:admin:write');
    const result = await ctx.deps.db.transaction().execute((trx) =>
      replacePoolPolicy(trx, {
        poolId: input.poolId,
        policy: input.policy,
        expectedVersion: input.expectedVersion,
        actor: actor(ctx),
      }),
    );
    if (!result) throw noPool(input.poolId);
    if (result.outcome === 'conflict') {
      throw new ComputeError(
        'CONFLICT',
        `expectedVersion: pool ${input.poolId}'s policy is at version ${result.version}, not ${input.expectedVersion}; read it again (admin.poolPolicyHistory) and retry`,
        { policyVersion: result.version },
      );
    }
    forgetCachedPools(ctx);
    return {
      poolId: input.poolId,
      policy: input.policy,
      policyVersion: result.version,
      archived: result.archived,
    };
  },
});

const poolPolicyHistory = defineMethod({
  summary: "Every change of a pool's policy, newest first (at most 100), as the audit log recorded it.",
  action: 'compute:admin:read',
  input: z.strictObject({ poolId }),
  output: z.object({
    poolId: z.string(),
    policyVersion: z.number(),
    policy: z.record(z.string(), z.unknown()),
    versions: z.array(
      z.object({
        version: z.number(),
        policy: z.record(z.string(), z.unknown()),
        changedAt: z.number(),
        changedBy: z.string().nullable(),
        requestId: z.string().nullable(),
      }),
    ),
  }),
  handler: async (ctx, input) => {
    await requireRootAdmin(ctx, 'compute:admin:read');
    const pool = await findPool(ctx.deps.db, { id: input.poolId });
    if (!pool) throw noPool(input.poolId);
    return {
      poolId: pool.id,
      policyVersion: pool.policyVersion,
      policy: pool.policy,
      versions: await listPoolPolicyVersions(ctx.deps.db, pool.id),
    };
  },
});

const archivePool = defineMethod({
  summary:
    'Archive a pool: it admits nothing more, its pending and placed reservations fail (Unschedulable/PoolGone), active ones run to their end. Again: unchanged.',
  action: 'compute:admin:write',
  input: z.strictObject({ poolId, reason: reason.optional() }),
  output: z.object({
    poolId: z.string(),
    archived: z.literal(true),
    archivedAt: z.number(),
    changed: z.boolean(),
    reservationsEnding: z.number(),
  }),
  handler: async (ctx, input) => {
    await requireRootAdmin(ctx, 'compute:admin:write');
    const result = await ctx.deps.db
      .transaction()
      .execute((trx) =>
        archivePoolRow(trx, { poolId: input.poolId, reason: input.reason, actor: actor(ctx) }),
      );
    if (!result) throw noPool(input.poolId);
    forgetCachedPools(ctx);
    const reservationsEnding = await wakePoolGone(ctx, { poolId: input.poolId });
    return {
      poolId: input.poolId,
      archived: true as const,
      archivedAt: result.archivedAt,
      changed: result.changed,
      reservationsEnding,
    };
  },
});

const withdrawOffer = defineMethod({
  summary:
    "Withdraw a pool's offer to a tenant: the tenant can no longer book it, its pending and placed reservations there fail (Unschedulable/PoolGone), active ones run to their end.",
  action: 'compute:admin:write',
  input: z.strictObject({ poolId, tenantId, reason: reason.optional() }),
  output: z.object({ poolId: z.string(), tenantId: z.string(), reservationsEnding: z.number() }),
  handler: async (ctx, input) => {
    await requireRootAdmin(ctx, 'compute:admin:write');
    const pool = await findPool(ctx.deps.db, { id: input.poolId });
    if (!pool) throw noPool(input.poolId);
    if (pool.ownerTenantId === input.tenantId) {
      throw new ComputeError(
        'INVALID_INPUT',
        `tenantId: tenant ${input.tenantId} owns pool ${input.poolId}; an owner has no offer to withdraw (archive the pool instead)`,
      );
    }
    const withdrawn = await ctx.deps.db
      .transaction()
      .execute((trx) => withdrawPoolOffer(trx, { ...input, actor: actor(ctx) }));
    if (!withdrawn) {
      throw new ComputeError(
        'NOT_FOUND',
        `pool ${input.poolId} is not offered to tenant ${input.tenantId}; admin.listPools shows its offers`,
      );
    }
    forgetCachedPools(ctx);
    const reservationsEnding = await wakePoolGone(ctx, { poolId: input.poolId, tenantId: input.tenantId });
    return { poolId: input.poolId, tenantId: input.tenantId, reservationsEnding };
  },
});

/** `admin.*` for pools beyond their creation: policy changes and their history, archive, withdraw. */
export const adminPoolMethods = { setPoolPolicy, poolPolicyHistory, archivePool, withdrawOffer };
