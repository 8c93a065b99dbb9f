import { z } from 'zod';
import { readPoolCapacity } from '../db/allocations/capacity.ts';
import { previewGangPlacement } from '../db/allocations/gang-placement.ts';
import { placementRequestOf, previewPlacement } from '../db/allocations/placement.ts';
import { readComputeNow } from '../db/clock.ts';
import { previewMachines } from '../db/metal/dedicated-placement.ts';
import { poolForTenant, resolveRequestForPool } from '../db/reservations/draft.ts';
import { type PlannedPreemption, planSpotPreemption } from '../db/reservations/preemption.ts';
import { quotaNeeds, readTenantQuotas } from '../db/reservations/quota.ts';
import { calendarHorizonDays, readPoolPolicy } from '../domain/pool-policy.ts';
import { normalizeRequest, startOutOfHorizon } from '../domain/reservation-request.ts';
import { previewInput, tenantIdSchema } from '../domain/reservation-schema.ts';
import { gangPlanOutcome, gangPreviewFields } from './capacity-gang.ts';
import { defineMethod } from './method.ts';
import { preCheckTenant, requireOnTenant } from './reservations/access.ts';

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
    /** A gang: the members it would take, the topology value, and how each value fares. */
    gang: z
      .object({
        topologyValue: z.string().nullable(),
        members: z.array(
          z.object({ nodeId: z.string(), nodeName: z.string(), deviceIds: z.array(z.string()) }),
        ),
        values: z.array(
          z.object({
            value: z.string().nullable(),
            nodes: z.number(),
            fitting: z.number(),
            rejected: z.string().nullable(),
          }),
        ),
      })
      .optional(),
    /**
     * A regular request that does not fit, but would by preempting spot reservations: from when
     * (the notice deadline, or at once when none of them had started), on which node, whom.
     */
    preemption: z
      .object({
        window: z.object({ start: z.number(), end: z.number() }),
        nodeId: z.string(),
        noticeSeconds: z.number(),
        spotReservations: z.array(z.string()),
        noticed: z.array(z.string()),
        message: z.string(),
      })
      .optional(),
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
    const now = await readComputeNow(db);
    // The same horizon admission holds a requested start to.
    const outside =
      request.start !== undefined
        ? startOutOfHorizon(request.start, now.getTime(), calendarHorizonDays(readPoolPolicy(pool.policy)))
        : null;
    if (outside) throw outside;
    const start = Math.max(now.getTime(), request.start ?? 0);
    const window = { start, end: start + request.durationMs };
    const placement = {
      poolId: pool.id,
      request: placementRequestOf(request),
      window,
      durationMs: request.durationMs,
    };
    const gang = request.gang
      ? await previewGangPlacement(db, { ...placement, gang: request.gang })
      : undefined;
    const outcome = gang
      ? gangPlanOutcome(gang, window)
      : request.binding === 'node'
        ? await previewMachines(db, { poolId: pool.id, count: request.devices[0]!.count, window })
        : await previewPlacement(db, placement, ctx.deps.caches);
    // What create would do next: preempt spot reservations (read only here, nothing is cut).
    const planned =
      outcome.fits || gang || request.binding === 'node'
        ? null
        : await planSpotPreemption(db, {
            poolId: pool.id,
            policy: pool.policy,
            request,
            now: now.getTime(),
            window,
            earliestStart: outcome.earliestStart,
          });
    const needs = quotaNeeds(request, booked, share);
    const quotaRows = await readTenantQuotas(db, input.tenantId, pool.id);
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
          ...(gang ? { gang: gangPreviewFields(gang) } : {}),
          quota,
        }
      : {
          fits: false,
          window,
          resources: booked,
          hostShare: share,
          message: outcome.message,
          earliestStart: outcome.earliestStart,
          ...(gang ? { gang: gangPreviewFields(gang) } : {}),
          ...(planned ? { preemption: preemptionPreview(planned) } : {}),
          quota,
        };
  },
});

/** capacity.preview's `preemption`: the window, node and spot reservations a create would take. */
function preemptionPreview({ choice, noticeMs }: PlannedPreemption) {
  const start = new Date(choice.window.start).toISOString();
  const whom = `${choice.reservationIds.length} spot reservation(s) on this node`;
  return {
    window: choice.window,
    nodeId: choice.nodeId,
    noticeSeconds: noticeMs / 1000,
    spotReservations: choice.reservationIds,
    noticed: choice.noticed,
    message:
      choice.noticed.length > 0
        ? `fits by preempting ${whom}: they get ${noticeMs / 1000} s of notice and it starts at ${start}`
        : `fits by re-queueing ${whom} that have not started: it starts at ${start}`,
  };
}

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
    await requireOnTenant(ctx, input.tenantId, 'compute:capacity:read');
    return { pools: await readPoolCapacity(ctx.deps.db, input) };
  },
});

/** `capacity.*`: preview a request without booking it, and read each usable pool's capacity. */
export const capacityMethods = { preview, get };
