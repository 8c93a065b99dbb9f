import { z } from 'zod';
import {
  findPool,
  findSite,
  insertPool,
  insertSite,
  listAllSites,
  listPoolsWithOffers,
  listTenantQuotas,
  offerPool,
} from '../../db/nodes/fleet.ts';
import { ComputeError } from '../../domain/errors.ts';
import { poolPolicySchema } from '../../domain/pool-policy.ts';
import { defineMethod } from '../method.ts';
import { iamAdmin, requireRootAdmin } from './guard.ts';

const tenantId = z
  .string()
  .regex(/^[a-z0-9][a-z0-9_-]{0,62}$/, "a tenant id: lower-case letters, digits, '-' or '_'");
const name = z.string().regex(/^[a-z0-9][a-z0-9.-]{0,62}$/, "a name: lower-case letters, digits, '.' or '-'");

const quotaSchema = z.partialRecord(
  z.enum(['gpu', 'gpu.mig', 'gpu.slot', 'vcpu', 'memoryGiB']),
  z.number().min(0).max(1_000_000),
);

const createSite = defineMethod({
  summary: 'Create a site (a location with a region).',
  action: 'compute:admin:write',
  input: z.strictObject({
    name,
    region: z.string().regex(/^[a-z0-9-]{2,40}$/, 'a region such as eu-central-1'),
  }),
  output: z.object({ id: z.string(), name: z.string(), region: z.string() }),
  handler: async (ctx, input) => {
    await requireRootAdmin(ctx, 'compute:admin:write');
    const exists = await findSite(ctx.deps.db, { name: input.name });
    if (exists)
      throw new ComputeError('CONFLICT', `site ${input.name} already exists`, { siteId: exists.id });
    const id = await insertSite(ctx.deps.db, input);
    return { id, ...input };
  },
});

const listSites = defineMethod({
  summary: 'Every site.',
  action: 'compute:admin:read',
  input: z.strictObject({}),
  output: z.object({ sites: z.array(z.object({ id: z.string(), name: z.string(), region: z.string() })) }),
  handler: async (ctx) => {
    await requireRootAdmin(ctx, 'compute:admin:read');
    return { sites: await listAllSites(ctx.deps.db) };
  },
});

const poolOut = z.object({
  id: z.string(),
  siteId: z.string(),
  ownerTenantId: z.string(),
  name: z.string(),
  gpuModel: z.string(),
  sharingMode: z.string(),
  policy: z.record(z.string(), z.unknown()),
  policyVersion: z.number(),
  archived: z.boolean(),
});

const createPool = defineMethod({
  summary: 'Create a pool of one GPU model at a site, owned by a tenant (default: the root).',
  action: 'compute:admin:write',
  input: z.strictObject({
    siteId: z.string().min(1),
    name,
    gpuModel: z.string().regex(/^[a-z0-9.-]{1,40}$/, 'a GPU model such as h100'),
    ownerTenantId: tenantId.optional(),
    sharingMode: z.enum(['exclusive', 'mig', 'time-slice', 'mps']).optional(),
    policy: poolPolicySchema.optional(),
  }),
  output: poolOut,
  handler: async (ctx, input) => {
    await requireRootAdmin(ctx, 'compute:admin:write');
    const owner = input.ownerTenantId ?? ctx.principal.tenantId;
    if (!(await iamAdmin(ctx).getTenant(owner))) {
      throw new ComputeError('NOT_FOUND', `ownerTenantId: tenant ${owner} does not exist`);
    }
    const site = await findSite(ctx.deps.db, { id: input.siteId });
    if (!site) throw new ComputeError('NOT_FOUND', `siteId: site ${input.siteId} does not exist`);
    const taken = await findPool(ctx.deps.db, { ownerTenantId: owner, name: input.name });
    if (taken)
      throw new ComputeError('CONFLICT', `tenant ${owner} already has a pool named ${input.name}`, {
        poolId: taken.id,
      });
    const pool = {
      siteId: input.siteId,
      ownerTenantId: owner,
      name: input.name,
      gpuModel: input.gpuModel,
      sharingMode: input.sharingMode ?? 'exclusive',
      policy: input.policy ?? {},
    };
    const id = await insertPool(ctx.deps.db, pool);
    return { id, ...pool, policyVersion: 1, archived: false };
  },
});

const listPools = defineMethod({
  summary: 'Every pool, with the tenants it is offered to.',
  action: 'compute:admin:read',
  input: z.strictObject({}),
  output: z.object({ pools: z.array(poolOut.extend({ offeredTo: z.array(z.string()) })) }),
  handler: async (ctx) => {
    await requireRootAdmin(ctx, 'compute:admin:read');
    return { pools: await listPoolsWithOffers(ctx.deps.db) };
  },
});

const offer = defineMethod({
  summary:
    'Offer a pool to a tenant with a quota per resource (gpu, vcpu, memoryGiB, …); a resource left out grants zero. Again: updates the quota.',
  action: 'compute:admin:write',
  input: z.strictObject({
    poolId: z.string().min(1),
    tenantId,
    quota: quotaSchema,
    priority: z.number().int().min(-1000).max(1000).optional(),
    onBudgetExceeded: z.enum(['allow', 'stop-new', 'drain']).optional(),
  }),
  output: z.object({ poolId: z.string(), tenantId: z.string(), quota: z.record(z.string(), z.number()) }),
  handler: async (ctx, input) => {
    await requireRootAdmin(ctx, 'compute:admin:write');
    const pool = await findPool(ctx.deps.db, { id: input.poolId });
    if (!pool) throw new ComputeError('NOT_FOUND', `poolId: pool ${input.poolId} does not exist`);
    if (!(await iamAdmin(ctx).getTenant(input.tenantId))) {
      throw new ComputeError('NOT_FOUND', `tenantId: tenant ${input.tenantId} does not exist`);
    }
    const quota = Object.fromEntries(
      Object.entries(input.quota).filter(([, v]) => v !== undefined),
    ) as Record<string, number>;
    await offerPool(ctx.deps.db, {
      poolId: input.poolId,
      tenantId: input.tenantId,
      quota,
      priority: input.priority,
      onBudgetExceeded: input.onBudgetExceeded,
    });
    return { poolId: input.poolId, tenantId: input.tenantId, quota };
  },
});

const listQuotas = defineMethod({
  summary: "A tenant's quotas: limit and used per pool and resource.",
  action: 'compute:admin:read',
  input: z.strictObject({ tenantId }),
  output: z.object({
    quotas: z.array(
      z.object({ poolId: z.string(), resource: z.string(), limit: z.number(), used: z.number() }),
    ),
  }),
  handler: async (ctx, input) => {
    await requireRootAdmin(ctx, 'compute:admin:read');
    return { quotas: await listTenantQuotas(ctx.deps.db, input.tenantId) };
  },
});

export const adminFleetMethods = { createSite, listSites, createPool, listPools, offer, listQuotas };
