import { placementRequestOf, planWholePool } from '../db/allocations/placement.ts';
import { readDemandCounts, readPendingForDemand } from '../db/holds/demand.ts';
import { parseStoredRequest } from '../db/reservations/stored.ts';
import { demandInput, demandReportSchema, reservationShape } from '../domain/demand.ts';
import { planPlacement, type Rejection, summarizeNoFit } from '../domain/placer.ts';
import { defineMethod } from './method.ts';
import { requireOnTenant } from './reservations/access.ts';

/** The pending reservations the report explains, at most (each is planned against its whole pool). */
const pendingExplained = 50;

const demand = defineMethod({
  summary:
    "The unmet-demand ledger over a window: refused holds and reservations that went pending, were refused for capacity or quota, or failed for capacity, counted by shape, pool, tenant and reason, the top unmet shapes, and for each pending reservation why (the blocking reasons per group of nodes), its place in its pool's queue and the earliest start the placer can promise. The tenant's own requests, and every tenant's in the pools it owns.",
  action: 'compute:capacity:read',
  input: demandInput,
  output: demandReportSchema,
  handler: async (ctx, input) => {
    await requireOnTenant(ctx, input.tenantId, 'compute:capacity:read');
    const db = ctx.deps.db;
    const [counts, pendingRows] = await Promise.all([
      readDemandCounts(db, input),
      readPendingForDemand(db, { tenantId: input.tenantId, poolId: input.poolId, limit: pendingExplained }),
    ]);
    const pending = [];
    for (const r of pendingRows) {
      const stored = parseStoredRequest(r.id, r.request);
      const request = placementRequestOf(stored);
      const start = Math.max(r.now.getTime(), r.requested_start?.getTime() ?? 0);
      const durationMs = Number(r.duration_ms);
      const plan = await planWholePool(db, {
        poolId: r.pool_id,
        request,
        window: { start, end: start + durationMs },
        durationMs,
      });
      const rejections = planPlacement(plan.nodes, request, plan.window).rejections;
      const blocking = (Object.entries(rejections) as Array<[Rejection, number]>)
        .sort((a, b) => b[1] - a[1])
        .map(([reason, nodes]) => {
          const one = summarizeNoFit({ fits: [], rejections: { [reason]: nodes }, nodes }, request);
          return { reason, nodes, message: one.slice(one.indexOf(': ') + 2) };
        });
      pending.push({
        reservationId: r.id,
        tenantId: r.tenant_id,
        poolId: r.pool_id,
        shape: reservationShape(stored),
        pendingSince: r.pending_since?.getTime() ?? null,
        queuePosition: Number(r.queue_position),
        queueLength: Number(r.queue_length),
        blocking,
        message: plan.fits ? 'a node fits now; the next placement attempt takes it' : plan.message,
        earliestStart: plan.fits ? start : plan.earliestStart,
      });
    }
    return { ...counts, pending };
  },
});

/** `capacity.demand` (joined to the capacity group in the registry). */
export const capacityDemandMethods = { demand };
