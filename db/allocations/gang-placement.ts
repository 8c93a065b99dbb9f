import { sql, type Transaction } from 'kysely';
import type { AdmissionCaches } from '../../core/admission-caches.ts';
import type { Database, Db } from '../../core/database.ts';
import {
  earliestGangStart,
  type GangGroupSummary,
  type GangShape,
  planGang,
  summarizeGangGroups,
  summarizeGangNoFit,
  topologyValueOf,
} from '../../domain/gang-placer.ts';
import { newId } from '../../domain/ids.ts';
import type { Interval, NodeFit, PlacementRequest, PlacerNode } from '../../domain/placer.ts';
import { planPlacement, summarizeNoFit } from '../../domain/placer.ts';
import type { NormalizedRequest } from '../../domain/reservation-request.ts';
import { findAndBookMachines } from '../metal/dedicated-placement.ts';
import {
  counterOfferHorizonMs,
  findAndBook,
  PlacementContention,
  placementRequestOf,
  tryBook,
  withCounterOffer,
} from './placement.ts';
import { loadPlacerNodes } from './placement-load.ts';

type Trx = Transaction<Database>;

/** How many groups (topology values) a booking tries before it reads the pool again. */
const groupsPerRound = 4;

export type GangBookOutcome =
  | { placed: true; fits: NodeFit[]; allocationIds: string[]; topologyValue: string | null }
  | { placed: false; message: string; earliestStart: number | null };

/** Every node of the pool as the placer sees it, with bookings over the counter-offer's horizon. */
function loadForGang(
  db: Db | Trx,
  input: { poolId: string; request: PlacementRequest; window: Interval; durationMs: number },
) {
  return loadPlacerNodes(db, {
    poolId: input.poolId,
    deviceClass: input.request.deviceClass,
    horizon: {
      start: input.window.start,
      end: input.window.start + counterOfferHorizonMs + input.durationMs,
    },
  });
}

/** The NoFit summary of a gang, per topology value, with the earliest start it fits within 14 days. */
function gangNoFit(
  nodes: readonly PlacerNode[],
  input: { request: PlacementRequest; gang: GangShape; window: Interval; durationMs: number },
  plan: ReturnType<typeof planGang>,
): { message: string; earliestStart: number | null } {
  const earliest = earliestGangStart(
    nodes,
    input.request,
    input.gang,
    input.durationMs,
    input.window.start,
    counterOfferHorizonMs,
  );
  const summary = summarizeGangNoFit(plan, input.request, input.gang);
  return { message: withCounterOffer(summary, earliest, input.window.start), earliestStart: earliest };
}

/** Numbers a booked allocation as gang member `gangIndex` (re-placed `memberAttempt` times). */
async function markMember(
  trx: Trx,
  allocationId: string,
  member: { gangIndex: number; memberAttempt: number },
): Promise<void> {
  await trx
    .updateTable('allocations')
    .set({ gang_index: member.gangIndex, member_attempt: member.memberAttempt })
    .where('id', '=', allocationId)
    .execute();
}

/**
 * Books a whole gang in the caller's transaction, all or nothing: `gang.size` distinct nodes that
 * each fit the per-node request over the one `window`, on one value of `gang.topologyKey` when
 * given (the value planGang ranks best, then the next ones). Each member's atoms are try-locked
 * (never waited for) and re-checked, then inserted through the EXCLUDE constraint; a group that
 * cannot be completed is rolled back to its savepoint, so no half gang is ever left. Members are
 * numbered by `gang_index` 0..size-1. NoFit answers the per-value summary and the counter-offer.
 * Throws PlacementContention when only concurrent placements stood in the way (retry the
 * transaction, e.g. through withPlacementTransaction).
 */
export async function findAndBookGang(
  trx: Trx,
  input: {
    poolId: string;
    request: PlacementRequest;
    gang: GangShape;
    window: Interval;
    durationMs: number;
    reservationId: string;
  },
): Promise<GangBookOutcome> {
  let contended = false;
  for (let round = 0; round < 2; round++) {
    const nodes = await loadForGang(trx, input);
    const plan = planGang(nodes, input.request, input.gang, input.window, input.reservationId);
    if (plan.candidates.length === 0) {
      if (contended) break;
      return { placed: false, ...gangNoFit(nodes, input, plan) };
    }
    for (const group of plan.candidates.slice(0, groupsPerRound)) {
      await sql`SAVEPOINT gang_group`.execute(trx);
      const booked: NodeFit[] = [];
      const allocationIds: string[] = [];
      for (const fit of group.plan.fits) {
        if (booked.length === input.gang.size) break;
        const allocationId = newId('alloc');
        const outcome = await tryBook(trx, {
          fit,
          window: input.window,
          reservationId: input.reservationId,
          allocationId,
        });
        if (outcome === 'booked') {
          await markMember(trx, allocationId, { gangIndex: booked.length, memberAttempt: 0 });
          booked.push(fit);
          allocationIds.push(allocationId);
        } else contended = true;
      }
      if (booked.length === input.gang.size) {
        await sql`RELEASE SAVEPOINT gang_group`.execute(trx);
        return { placed: true, fits: booked, allocationIds, topologyValue: group.value };
      }
      await sql`ROLLBACK TO SAVEPOINT gang_group`.execute(trx);
    }
  }
  throw new PlacementContention();
}

/** What capacity.preview answers for a gang, booking nothing. */
export type GangPreview =
  | { fits: true; members: NodeFit[]; topologyValue: string | null; groups: GangGroupSummary[] }
  | { fits: false; message: string; earliestStart: number | null; groups: GangGroupSummary[] };

/**
 * Plans a gang without booking (capacity.preview): the members it would take on the best
 * topology value, or the per-value NoFit summary with the earliest start within 14 days; and, per
 * value, its nodes, how many fit and why it was rejected. Read-only.
 */
export async function previewGangPlacement(
  db: Db,
  input: { poolId: string; request: PlacementRequest; gang: GangShape; window: Interval; durationMs: number },
): Promise<GangPreview> {
  const nodes = await loadForGang(db, input);
  const plan = planGang(nodes, input.request, input.gang, input.window);
  const groups = summarizeGangGroups(plan, input.request, input.gang);
  const best = plan.candidates[0];
  if (best) {
    return {
      fits: true,
      members: best.plan.fits.slice(0, input.gang.size),
      topologyValue: best.value,
      groups,
    };
  }
  return { fits: false, ...gangNoFit(nodes, input, plan), groups };
}

/**
 * Re-places one gang member on its own, in the caller's transaction: a node of the gang's topology
 * value (any node without a key) that none of `excludeNodeIds` (the other members' nodes and the
 * one it leaves) is, over `window`, booked like any placement and numbered `gangIndex` with
 * `memberAttempt`. Not placed: the placer's summary over the nodes it could use. Throws
 * PlacementContention when only concurrent placements stood in the way.
 */
export async function bookGangMember(
  trx: Trx,
  input: {
    poolId: string;
    reservationId: string;
    request: PlacementRequest;
    gang: GangShape;
    topologyValue: string | null;
    window: Interval;
    excludeNodeIds: readonly string[];
    gangIndex: number;
    memberAttempt: number;
  },
): Promise<{ placed: true; fit: NodeFit; allocationId: string } | { placed: false; message: string }> {
  const excluded = new Set(input.excludeNodeIds);
  const key = input.gang.topologyKey;
  const nodes = (
    await loadPlacerNodes(trx, {
      poolId: input.poolId,
      deviceClass: input.request.deviceClass,
      horizon: input.window,
    })
  ).filter(
    (n) =>
      !excluded.has(n.id) &&
      (key === undefined || topologyValueOf(n, key) === (input.topologyValue ?? undefined)),
  );
  const plan = planPlacement(nodes, input.request, input.window, `${input.reservationId}/${input.gangIndex}`);
  let contended = false;
  for (const fit of plan.fits.slice(0, 16)) {
    const allocationId = newId('alloc');
    const outcome = await tryBook(trx, {
      fit,
      window: input.window,
      reservationId: input.reservationId,
      allocationId,
    });
    if (outcome === 'booked') {
      await markMember(trx, allocationId, { gangIndex: input.gangIndex, memberAttempt: input.memberAttempt });
      return { placed: true, fit, allocationId };
    }
    contended = true;
  }
  if (contended) throw new PlacementContention();
  const where = key === undefined ? 'the pool' : `${key}=${input.topologyValue}`;
  const why =
    nodes.length === 0
      ? 'the other members hold (or just failed on) every node of it'
      : summarizeNoFit(plan, input.request);
  return { placed: false, message: `no node is left in ${where} for gang member ${input.gangIndex}: ${why}` };
}

/**
 * Finds and books what a stored request asks for, in the caller's transaction: a gang through
 * findAndBookGang, anything else on one node through findAndBook. `fit` is the first (or only)
 * member, `fits` every member in `gang_index` order. Same errors as those two.
 */
export async function findAndBookRequest(
  trx: Trx,
  request: NormalizedRequest,
  input: {
    poolId: string;
    window: Interval;
    durationMs: number;
    reservationId: string;
    caches?: AdmissionCaches;
  },
): Promise<
  | { placed: true; fit: NodeFit; fits: NodeFit[]; topologyValue: string | null }
  | { placed: false; message: string; earliestStart: number | null }
> {
  // Dedicated root: whole machines, booked by their own placer (domain/dedicated-root.ts).
  if (request.binding === 'node') return findAndBookMachines(trx, request, input);
  const placement = placementRequestOf(request);
  if (request.gang) {
    const outcome = await findAndBookGang(trx, { ...input, request: placement, gang: request.gang });
    return outcome.placed
      ? { placed: true, fit: outcome.fits[0]!, fits: outcome.fits, topologyValue: outcome.topologyValue }
      : outcome;
  }
  const outcome = await findAndBook(trx, { ...input, request: placement });
  return outcome.placed ? { ...outcome, fits: [outcome.fit], topologyValue: null } : outcome;
}
