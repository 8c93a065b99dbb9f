import { z } from 'zod';
import {
  findHoldByKey,
  getHold,
  heartbeatHold,
  listHolds,
  releaseHold,
  resolveHoldTarget,
  takeHold,
} from '../../db/holds/holds.ts';
import { ComputeError } from '../../domain/errors.ts';
import {
  createHoldInput,
  holderName,
  holdRefSchema,
  holdViewSchema,
  listHoldsInput,
} from '../../domain/holds.ts';
import { newId } from '../../domain/ids.ts';
import { defineMethod, type MethodContext } from '../method.ts';
import { callerAudit, requireOnTenant } from '../reservations/access.ts';

/**
 * The holder's name from the caller's identity, or a refusal: a hold is never taken under a
 * made-up name (and such a refusal is not recorded, since it names no requester).
 */
async function nameTheHolder(
  ctx: MethodContext,
  extra: { path?: string | undefined; pid?: number | undefined },
) {
  const { principal } = ctx;
  const identities = await ctx.deps.iam.admin?.listIdentities(principal.tenantId);
  const identity = identities?.find((i) => i.id === principal.identityId);
  const holder = holderName({ name: identity?.name, tenantId: principal.tenantId }, extra);
  if (!holder) {
    throw new ComputeError(
      'INVALID_STATE',
      `identity ${principal.identityId} has no name this server can read, so the hold cannot name its holder; hold with a named identity (see admin.listIdentities)`,
      { identityId: principal.identityId },
    );
  }
  return holder;
}

/** The audit record of a hold changed by this call: the caller, its admission context, the method. */
function holdAudit(ctx: MethodContext, method: 'holds.create' | 'holds.release') {
  const audit = callerAudit(ctx, 'compute:capacity:hold');
  return { ...audit, context: { ...audit.context, method } };
}

const create = defineMethod({
  summary:
    "Takes a hold of a workload kind on one node (id or name), sized by the kind's declaration, live while it is heartbeated within its TTL (three 60 s heartbeats by default). Refused with CAPACITY_UNAVAILABLE and the exact sentence when the host has no room, is not accepting placements, publishes no CPU figure, or the kind declares none; a host with no fresh publication is taken on trust.",
  action: 'compute:capacity:hold',
  input: createHoldInput,
  output: holdViewSchema,
  handler: async (ctx, input) => {
    await requireOnTenant(ctx, input.tenantId, 'compute:capacity:hold');
    const holder = await nameTheHolder(ctx, input);
    const db = ctx.deps.db;
    const key = input.idempotencyKey;
    if (key) {
      const existing = await findHoldByKey(db, {
        tenantId: input.tenantId,
        identityId: ctx.principal.identityId,
        idempotencyKey: key,
      });
      if (existing) return existing;
    }
    const target = await resolveHoldTarget(db, input.tenantId, input.target);
    const outcome = await db.transaction().execute((trx) =>
      takeHold(trx, {
        tenantId: input.tenantId,
        identityId: ctx.principal.identityId,
        target,
        kind: input.kind,
        holder,
        idempotencyKey: key,
        ttlSeconds: input.ttlSeconds,
        dedupeKey: key ? `hold:${input.tenantId}:${ctx.principal.identityId}:${key}` : `hold:${newId('req')}`,
        audit: holdAudit(ctx, 'holds.create'),
      }),
    );
    if (!outcome.taken) {
      throw new ComputeError('CAPACITY_UNAVAILABLE', outcome.refusal.message, {
        reason: outcome.refusal.reason,
        ...outcome.refusal.details,
      });
    }
    return outcome.hold;
  },
});

const heartbeat = defineMethod({
  summary:
    'Heartbeats a live hold: its TTL starts again from now. A released or expired hold is INVALID_STATE (take a new one).',
  action: 'compute:capacity:hold',
  input: holdRefSchema,
  output: holdViewSchema,
  handler: async (ctx, input) => {
    await requireOnTenant(ctx, input.tenantId, 'compute:capacity:hold');
    return ctx.deps.db.transaction().execute((trx) => heartbeatHold(trx, input));
  },
});

const release = defineMethod({
  summary:
    'Releases a hold: its room comes back at once; it stays listed for an hour, marked as ended. Idempotent.',
  action: 'compute:capacity:hold',
  input: holdRefSchema,
  output: holdViewSchema,
  handler: async (ctx, input) => {
    await requireOnTenant(ctx, input.tenantId, 'compute:capacity:hold');
    return ctx.deps.db
      .transaction()
      .execute((trx) => releaseHold(trx, { ...input, audit: holdAudit(ctx, 'holds.release') }));
  },
});

const get = defineMethod({
  summary: 'One hold of the tenant, live or ended within the last hour.',
  action: 'compute:capacity:read',
  input: holdRefSchema,
  output: holdViewSchema,
  handler: async (ctx, input) => {
    await requireOnTenant(ctx, input.tenantId, 'compute:capacity:read');
    return getHold(ctx.deps.db, input);
  },
});

const list = defineMethod({
  summary:
    "The tenant's holds (and every hold on the nodes of the pools it owns), on one node with `target`: live ones and those ended within the last hour, newest first.",
  action: 'compute:capacity:read',
  input: listHoldsInput,
  output: z.object({ holds: z.array(holdViewSchema) }),
  handler: async (ctx, input) => {
    await requireOnTenant(ctx, input.tenantId, 'compute:capacity:read');
    const nodeIds = input.target
      ? [(await resolveHoldTarget(ctx.deps.db, input.tenantId, input.target)).id]
      : undefined;
    return {
      holds: await listHolds(ctx.deps.db, {
        tenantId: input.tenantId,
        nodeIds,
        includeEnded: input.includeEnded,
      }),
    };
  },
});

/** `holds.create/heartbeat/release/get/list`. */
export const holdLifecycleMethods = { create, heartbeat, release, get, list };
