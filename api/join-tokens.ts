import { z } from 'zod';
import { ensureCaCertificate } from '../db/nodes/certificate-authority.ts';
import { listPoolIdsOwnedBy } from '../db/nodes/fleet.ts';
import {
  createJoinToken,
  findJoinToken,
  type JoinTokenView,
  listJoinTokens,
  revokeJoinToken,
} from '../db/nodes/join-tokens.ts';
import { ComputeError } from '../domain/errors.ts';
import { defineMethod } from './method.ts';
import { requirePool, requireTenantRead } from './nodes-access.ts';
import { apiSealer } from './sealer.ts';

const tokenView = z.object({
  id: z.string(),
  poolId: z.string(),
  expiresAt: z.number(),
  maxUses: z.number().int(),
  uses: z.number().int(),
  revokedAt: z.number().nullable(),
  createdBy: z.string().nullable(),
  createdAt: z.number(),
  state: z.enum(['active', 'expired', 'used', 'revoked']),
});

/** The token's state by the database's clock (`expired` is read with `compute_now()`). */
function view(t: JoinTokenView): z.infer<typeof tokenView> {
  const state = t.revokedAt ? 'revoked' : t.uses >= t.maxUses ? 'used' : t.expired ? 'expired' : 'active';
  return {
    id: t.id,
    poolId: t.poolId,
    expiresAt: t.expiresAt.getTime(),
    maxUses: t.maxUses,
    uses: t.uses,
    revokedAt: t.revokedAt?.getTime() ?? null,
    createdBy: t.createdBy,
    createdAt: t.createdAt.getTime(),
    state,
  };
}

const create = defineMethod({
  summary:
    'A join token for one pool: shown once (only its hash is stored), valid ttlSeconds, maxUses machines.',
  action: 'compute:nodes:join',
  input: z.strictObject({
    poolId: z.string().min(1).max(100),
    ttlSeconds: z
      .number()
      .int()
      .min(60)
      .max(30 * 86_400)
      .default(3600),
    maxUses: z.number().int().min(1).max(10_000).default(1),
  }),
  output: tokenView.extend({
    token: z.string(),
    /** What `bcd join` needs besides the token: the gateway and the control plane's CA. */
    gateway: z.string(),
    caCertificatePem: z.string(),
    command: z.string(),
  }),
  handler: async (ctx, input) => {
    const pool = await requirePool(ctx, input.poolId, 'compute:nodes:join');
    if (pool.archived) throw new ComputeError('INVALID_STATE', `pool ${input.poolId} is archived`);
    const { config } = ctx.deps;
    // The certificate only: the CA's private key is the gateway's (created sealed if need be).
    // First, so a server that cannot create the CA refuses before a token exists.
    const caCertificatePem = await ensureCaCertificate(ctx.deps.db, {
      trustDomain: config.BETTER_COMPUTE_TRUST_DOMAIN,
      sealer: () => apiSealer(config, "the control plane CA's private key"),
    });
    const created = await createJoinToken(ctx.deps.db, { ...input, createdBy: ctx.principal.identityId });
    const stored = await findJoinToken(ctx.deps.db, created.id);
    const host = config.BETTER_COMPUTE_GATEWAY_HOST;
    const gateway = `${host.includes(':') ? `[${host}]` : host}:${config.BETTER_COMPUTE_GATEWAY_PORT}`;
    return {
      ...view(stored!),
      token: created.token,
      gateway,
      caCertificatePem,
      command: `bcd join --token ${created.token} --gateway ${gateway} --ca-file ca.pem`,
    };
  },
});

const list = defineMethod({
  summary: 'Join tokens of the pools the caller manages (never their secrets), newest first.',
  action: 'compute:nodes:read',
  input: z.strictObject({
    poolId: z.string().min(1).max(100).optional(),
    limit: z.number().int().min(1).max(500).default(100),
    cursor: z.string().max(100).optional(),
  }),
  output: z.object({ tokens: z.array(tokenView), nextCursor: z.string().nullable() }),
  handler: async (ctx, input) => {
    let poolIds: string[] | undefined;
    if (input.poolId) {
      await requirePool(ctx, input.poolId, 'compute:nodes:read');
      poolIds = [input.poolId];
    } else {
      await requireTenantRead(ctx, 'compute:nodes:read');
      if (!ctx.principal.rootAdmin) {
        poolIds = await listPoolIdsOwnedBy(ctx.deps.db, ctx.principal.tenantId);
      }
    }
    const rows = await listJoinTokens(ctx.deps.db, {
      limit: input.limit + 1,
      ...(poolIds ? { poolIds } : {}),
      ...(input.cursor ? { cursor: input.cursor } : {}),
    });
    const page = rows.slice(0, input.limit);
    return {
      tokens: page.map(view),
      nextCursor: rows.length > input.limit ? page.at(-1)!.id : null,
    };
  },
});

const revoke = defineMethod({
  summary: 'Revoke a join token: no machine joins with it any more (nodes that joined stay).',
  action: 'compute:nodes:join',
  input: z.strictObject({ tokenId: z.string().regex(/^jt_[0-9a-z]{26}$/, 'a join token id (jt_…)') }),
  output: tokenView,
  handler: async (ctx, input) => {
    const token = await findJoinToken(ctx.deps.db, input.tokenId);
    if (!token) throw new ComputeError('NOT_FOUND', `join token ${input.tokenId} not found`);
    await requirePool(ctx, token.poolId, 'compute:nodes:join').catch((error: unknown) => {
      if (error instanceof ComputeError && error.code === 'NOT_FOUND') {
        throw new ComputeError('NOT_FOUND', `join token ${input.tokenId} not found`);
      }
      throw error;
    });
    const revoked = await revokeJoinToken(ctx.deps.db, input.tokenId);
    return view(revoked!);
  },
});

export const joinTokenMethods = { create, list, revoke };
