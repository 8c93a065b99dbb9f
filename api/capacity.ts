import { sql } from 'kysely';
import { z } from 'zod';
import { placementRequestOf, previewPlacement } from '../db/allocations/placement.ts';
import { quotaNeeds } from '../db/reservations/quota.ts';
import { normalizeRequest } from '../domain/reservation-request.ts';
import { previewInput, tenantIdSchema } from '../domain/reservation-schema.ts';
import { defineMethod } from './method.ts';
import { preCheckTenant } from './reservations/access.ts';
import { poolForTenant, resolveRequestForPool } from './reservations/draft.ts';

const amounts = z.object({ vcpu: z.number(), memoryGiB: z.number(), hugepages1Gi: z.number() });

const preview = defineMethod({
  summary:
    'What reservations.create would do now, booking nothing: the node it would take, or why nothing fits and the earliest start within 14 days at which it would.',
  action: 'compute:capacity:read',
  input: previewInput,
  output: z.object({
    fits: z.boolean(),
    window: z.object({ start: z.number(), end: z.number() }),
    nodeId: z.string().optional(),
    deviceIds: z.array(z.string()).optional(),
    resources: amounts,
    hostShare: amounts,
    message: z.string().optional(),
    earliestStart: z.number().nullable().optional(),
    quota: z.array(
      z.object({ resource: z.string(), needed: z.number(), limit: z.number(), used: z.number() }),
    ),
  }),
  handler: async (ctx, input) => {
    await preCheckTenant(ctx, input.tenantId);
    const normalized = normalizeRequest(input);
    const db = ctx.deps.db;
    const pool = await poolForTenant(db, input.tenantId, normalized.poolId);
    await ctx.deps.iam.require(
      ctx.principal,
      'compute:capacity:read',
      {
        type: 'compute-pool',
        id: pool.id,
        tenantId: input.tenantId,
        attributes: { gpuModel: pool.gpu_model, region: pool.region },
      },
      { requestId: ctx.requestId },
    );
    const { request, booked, share } = await resolveRequestForPool(
      db,
      input.tenantId,
      pool,
      normalized,
      ctx.deps.caches,
    );
    const { rows } = await sql<{ now: Date }>`SELECT compute_now() AS now`.execute(db);
    const start = Math.max(rows[0]!.now.getTime(), request.start ?? 0);
    const window = { start, end: start + request.durationMs };
    const outcome = await previewPlacement(
      db,
      {
        poolId: pool.id,
        request: placementRequestOf(request),
        window,
        durationMs: request.durationMs,
      },
      ctx.deps.caches,
    );
    const needs = quotaNeeds(request, booked, share);
    const quotaRows = await db
      .selectFrom('quotas')
      .selectAll()
      .where('tenant_id', '=', input.tenantId)
      .where('pool_id', '=', pool.id)
      .execute();
    const quota = Object.entries(needs).map(([resource, needed]) => {
      const q = quotaRows.find((r) => r.resource === resource);
      return { resource, needed, limit: Number(q?.limit_amount ?? 0), used: Number(q?.used ?? 0) };
    });
    return outcome.fits
      ? {
          fits: true,
          window,
          nodeId: outcome.fit.nodeId,
          deviceIds: outcome.fit.deviceIds,
          resources: booked,
          hostShare: share,
          quota,
        }
      : {
          fits: false,
          window,
          resources: booked,
          hostShare: share,
          message: outcome.message,
          earliestStart: outcome.earliestStart,
          quota,
        };
  },
});

const poolCapacity = z.object({
  poolId: z.string(),
  name: z.string(),
  gpuModel: z.string(),
  region: z.string(),
  deviceClass: z.string(),
  nodes: z.number(),
  schedulableNodes: z.number(),
  allocatable: z.number(),
  allocated: z.number(),
  reserved: z.number(),
  available: z.number(),
  quota: z.object({ limit: z.number(), used: z.number() }),
});

const get = defineMethod({
  summary:
    'Per pool the tenant can use: allocatable atoms (on schedulable nodes), allocated (booked now), reserved (with a booking that starts later), available now, and the tenant quota.',
  action: 'compute:capacity:read',
  input: z.strictObject({ tenantId: tenantIdSchema, poolId: z.string().min(1).max(100).optional() }),
  output: z.object({ pools: z.array(poolCapacity) }),
  handler: async (ctx, input) => {
    await preCheckTenant(ctx, input.tenantId);
    await ctx.deps.iam.require(
      ctx.principal,
      'compute:capacity:read',
      { type: 'compute-tenant', id: input.tenantId, tenantId: input.tenantId },
      { requestId: ctx.requestId },
    );
    const onlyPool = input.poolId ? sql`AND p.id = ${input.poolId}` : sql``;
    const { rows } = await sql<{
      id: string;
      name: string;
      gpu_model: string;
      region: string;
      class: string;
      nodes: string;
      schedulable_nodes: string;
      allocatable: string;
      allocated: string;
      reserved: string;
      available: string;
      quota_limit: string | null;
      quota_used: string | null;
    }>`
      WITH visible AS (
        SELECT p.id, p.name, p.gpu_model, s.region,
               CASE p.sharing_mode WHEN 'exclusive' THEN 'gpu' WHEN 'mig' THEN 'gpu.mig' ELSE 'gpu.slot' END AS class
        FROM pools p JOIN sites s ON s.id = p.site_id
        WHERE p.archived_at IS NULL ${onlyPool}
          AND (p.owner_tenant_id = ${input.tenantId}
               OR EXISTS (SELECT 1 FROM pool_offers o WHERE o.pool_id = p.id AND o.tenant_id = ${input.tenantId}))
      ), atoms AS (
        SELECT v.id AS pool_id, d.id AS device_id,
               (n.provision_state = 'ready' AND NOT n.cordoned AND NOT n.maintenance AND NOT n.draining
                AND n.connectivity = 'connected' AND COALESCE(n.observed_generation, 0) >= 1 AND d.health = 'healthy'
                AND NOT EXISTS (SELECT 1 FROM node_conditions c WHERE c.node_id = n.id AND c.effect = 'NoSchedule')) AS ok
        FROM visible v JOIN nodes n ON n.pool_id = v.id
        JOIN devices d ON d.node_id = n.id AND d.class = v.class AND d.bookable AND d.removed_at IS NULL
      ), booked AS (
        SELECT b.device_id, bool_or(b.during @> compute_now()) AS now, bool_or(lower(b.during) > compute_now()) AS later
        FROM allocations a JOIN nodes n ON n.id = a.node_id JOIN visible v ON v.id = n.pool_id
        JOIN device_bookings b ON b.allocation_id = a.id
        WHERE a.state NOT IN ('released', 'failed') AND upper(a.during) > compute_now() AND upper(b.during) > compute_now()
        GROUP BY b.device_id
      )
      SELECT v.id, v.name, v.gpu_model, v.region, v.class,
             (SELECT count(*) FROM nodes n WHERE n.pool_id = v.id) AS nodes,
             (SELECT count(*) FROM nodes n WHERE n.pool_id = v.id AND n.provision_state = 'ready' AND NOT n.cordoned
                AND NOT n.maintenance AND NOT n.draining AND n.connectivity = 'connected'
                AND COALESCE(n.observed_generation, 0) >= 1) AS schedulable_nodes,
             count(*) FILTER (WHERE a.ok) AS allocatable,
             count(*) FILTER (WHERE bk.now) AS allocated,
             count(*) FILTER (WHERE bk.later) AS reserved,
             count(*) FILTER (WHERE a.ok AND NOT COALESCE(bk.now, false)) AS available,
             (SELECT limit_amount FROM quotas q WHERE q.tenant_id = ${input.tenantId} AND q.pool_id = v.id AND q.resource = v.class) AS quota_limit,
             (SELECT used FROM quotas q WHERE q.tenant_id = ${input.tenantId} AND q.pool_id = v.id AND q.resource = v.class) AS quota_used
      FROM visible v LEFT JOIN atoms a ON a.pool_id = v.id LEFT JOIN booked bk ON bk.device_id = a.device_id
      GROUP BY v.id, v.name, v.gpu_model, v.region, v.class
      ORDER BY v.name`.execute(ctx.deps.db);
    return {
      pools: rows.map((r) => ({
        poolId: r.id,
        name: r.name,
        gpuModel: r.gpu_model,
        region: r.region,
        deviceClass: r.class,
        nodes: Number(r.nodes),
        schedulableNodes: Number(r.schedulable_nodes),
        allocatable: Number(r.allocatable),
        allocated: Number(r.allocated),
        reserved: Number(r.reserved),
        available: Number(r.available),
        quota: { limit: Number(r.quota_limit ?? 0), used: Number(r.quota_used ?? 0) },
      })),
    };
  },
});

/** `capacity.*`: preview a request without booking it, and read each usable pool's capacity. */
export const capacityMethods = { preview, get };
