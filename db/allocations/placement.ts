import type { Transaction } from 'kysely';
import { type AdmissionCaches, createAdmissionCaches } from '../../core/admission-caches.ts';
import type { Database, Db } from '../../core/database.ts';
import { jitteredBackoffMs } from '../../domain/backoff.ts';
import { ComputeError } from '../../domain/errors.ts';
import { newId } from '../../domain/ids.ts';
import {
  earliestStart,
  fitNode,
  freeAtoms,
  type Interval,
  labelsNeeded,
  type NodeFit,
  type PlacementRequest,
  type PlacerNode,
  planPlacement,
  summarizeNoFit,
  tightestFits,
} from '../../domain/placer.ts';
import type { NormalizedRequest } from '../../domain/reservation-request.ts';
import { isTransientConflict } from '../conflict-retry.ts';
import { BookingConflict } from './bookings.ts';
import { loadPlacerNodes, sampleNodeIds, schedulableNodeIds } from './placement-load.ts';
import { type NodeVerification, tryInsertAllocationWithBookings, type WritesWhenBooked } from './try-book.ts';

type Trx = Transaction<Database>;

/** How far ahead a counter-offer looks for the earliest start that fits. */
export const counterOfferHorizonMs = 14 * 86_400_000;
/** Pools up to this many nodes are planned whole; larger ones from a sample first. */
const wholePoolLimit = 256;
/**
 * How many random nodes a large pool's sampled round reads beside its warm ones: enough for the
 * dozens of placements that run at once and whose warm nodes have no fit left. With 8, a pool
 * where each node holds one more request read a sample for one placement in three, and its rate
 * fell to 0.57 of an empty pool's (bench/README.md, 2026-12-06).
 */
const sampleSize = 24;
/**
 * A large pool is read whole for its room once the samples that found no fit looked at this share
 * of its nodes (see readRoom): samples that found room are no sign that the pool is mostly booked.
 */
const emptySampledShareForWholeRead = 0.5;

/**
 * The releases of the node claims (PlacerNodeCache.claim) each open placement transaction holds,
 * called once the transaction has ended (withPlacementTransaction), so this process's other
 * placements plan around nodes it is booking until its locks are gone.
 */
const openClaims = new WeakMap<object, Array<() => void>>();

/** Seconds a caller waits before retrying a placement that lost every race (PlacementContention). */
const contentionRetryAfterSeconds = 1;

/**
 * Thrown when every fitting candidate was locked by a concurrent placement and nothing else fit:
 * the caller rolls its transaction back (dropping every lock) and tries it again. Should it escape
 * (withPlacementTransaction ran out of attempts), it is a typed retryable answer, never INTERNAL.
 */
export class PlacementContention extends ComputeError {
  constructor(message = 'every fitting node was being booked concurrently') {
    super(
      'UNAVAILABLE',
      `${message}; nothing is wrong with the request: retry it (with the same idempotency key)`,
      { reason: 'placement-contention', retryAfterSeconds: contentionRetryAfterSeconds },
    );
  }
}

/** The placer's view of a stored request. */
export function placementRequestOf(request: NormalizedRequest): PlacementRequest {
  const device = request.devices[0]!;
  return {
    deviceClass: device.class,
    count: device.count,
    topology: device.topology,
    ...(device.selector ? { selector: device.selector } : {}),
    resources: {
      vcpu: request.resources?.vcpu ?? 0,
      memoryGiB: request.resources?.memoryGiB ?? 0,
      hugepages1Gi: request.resources?.hugepages1Gi ?? 0,
    },
    requiredLabels: request.binding === 'kubernetes' ? ['bc.dev/cap.binding.kubernetes'] : [],
  };
}

export type PlanOutcome =
  | { fits: true; fit: NodeFit; window: Interval }
  | { fits: false; message: string; earliestStart: number | null; window: Interval };

/**
 * Plans without booking (capacity.preview, and the NoFit summary): every node of the pool, with
 * the counter-offer of the earliest start within 14 days when nothing fits now.
 */
export async function planWholePool(
  db: Db,
  input: { poolId: string; request: PlacementRequest; window: Interval; durationMs: number; seed?: string },
): Promise<PlanOutcome & { nodes: PlacerNode[] }> {
  const horizon = {
    start: input.window.start,
    end: input.window.start + counterOfferHorizonMs + input.durationMs,
  };
  const nodes = await loadPlacerNodes(db, {
    poolId: input.poolId,
    deviceClass: input.request.deviceClass,
    horizon,
  });
  const plan = planPlacement(nodes, input.request, input.window, input.seed);
  if (plan.fits.length > 0) return { fits: true, fit: plan.fits[0]!, window: input.window, nodes };
  return { fits: false, ...noFitOutcome(nodes, plan, input), window: input.window, nodes };
}

/** The NoFit summary with the counter-offer (the earliest start within 14 days), from loaded nodes. */
function noFitOutcome(
  nodes: readonly PlacerNode[],
  plan: ReturnType<typeof planPlacement>,
  input: { request: PlacementRequest; window: Interval; durationMs: number },
): { message: string; earliestStart: number | null } {
  const earliest = earliestStart(
    nodes,
    input.request,
    input.durationMs,
    input.window.start,
    counterOfferHorizonMs,
  );
  const summary = summarizeNoFit(plan, input.request);
  return { message: withCounterOffer(summary, earliest, input.window.start), earliestStart: earliest };
}

/**
 * The NoFit outcomes answered from each whole read of a large pool (one array, whoever planned
 * from it), per request shape: the window's start they were answered for and the outcome.
 */
const noFitsOfRead = new WeakMap<
  readonly PlacerNode[],
  Map<string, { from: number; outcome: { message: string; earliestStart: number | null } }>
>();

const shapeOf = (input: { request: PlacementRequest; durationMs: number }) =>
  JSON.stringify([input.request, input.durationMs]);

/**
 * The NoFit outcome already answered from this whole read for the request's shape, when it holds
 * for this window too: the window starts after the start it was answered for and before its
 * counter-offer, and no fit begins in between (earliestStart tried every instant one can begin at
 * and found none before the counter-offer). Bookings this process made since only take room away.
 */
function knownNoFit(
  nodes: readonly PlacerNode[],
  input: { request: PlacementRequest; window: Interval; durationMs: number },
): { message: string; earliestStart: number | null } | undefined {
  const known = noFitsOfRead.get(nodes)?.get(shapeOf(input));
  const start = input.window.start;
  return known && known.from <= start && (known.outcome.earliestStart ?? Infinity) > start
    ? known.outcome
    : undefined;
}

/** noFitOutcome over every node of a whole read, kept for the placements that plan from it next (knownNoFit). */
function sharedNoFitOutcome(
  nodes: readonly PlacerNode[],
  plan: ReturnType<typeof planPlacement>,
  input: { request: PlacementRequest; window: Interval; durationMs: number },
): { message: string; earliestStart: number | null } {
  let byShape = noFitsOfRead.get(nodes);
  if (!byShape) {
    byShape = new Map();
    noFitsOfRead.set(nodes, byShape);
  }
  const outcome = noFitOutcome(nodes, plan, input);
  byShape.set(shapeOf(input), { from: input.window.start, outcome });
  return outcome;
}

/** A NoFit summary with its counter-offer: the earliest start within 14 days, or that none fits. */
export function withCounterOffer(summary: string, earliest: number | null, start: number): string {
  return earliest !== null && earliest > start
    ? `${summary}; the earliest start that fits within 14 days is ${new Date(earliest).toISOString()}`
    : earliest === null
      ? `${summary}; nothing fits within the next 14 days`
      : summary;
}

/**
 * Books one fit in the caller's transaction, in one statement (tryInsertAllocationWithBookings):
 * the node's host-resource rows and its atoms' locks tried (never waited for), the room and the
 * atoms' bookings re-checked, then the allocation inserted through the EXCLUDE constraint and the
 * scalar guard. 'locked' (a concurrent placement holds an atom or a row) or 'stale' (an atom or
 * the host room was booked since the plan) change nothing. A refusal by the constraint or the
 * guard (a booking committed between the statement's snapshot and its locks) is
 * PlacementContention: the statement failed, so the transaction is retried whole.
 */
export async function tryBook(
  trx: Trx | Db,
  input: {
    fit: NodeFit;
    window: Interval;
    reservationId: string;
    allocationId?: string | undefined;
    /** The bookings' end when they outlast the window (a leased machine's wipe); default its end. */
    bookedUntil?: number | undefined;
    /** Wait for the node's host rows (in ascending node order only; see tryInsertAllocationWithBookings). */
    waitForHostRows?: boolean;
    /** Re-check the node as the plan saw it (a cached read; see tryInsertAllocationWithBookings). */
    verify?: Parameters<typeof tryInsertAllocationWithBookings>[1]['verify'];
    /** Writes made with the booking, outside a transaction (see tryInsertAllocationWithBookings). */
    alsoWhenBooked?: WritesWhenBooked;
  },
): Promise<'booked' | 'locked' | 'stale' | 'refused'> {
  const { fit, window } = input;
  try {
    return await tryInsertAllocationWithBookings(trx, {
      waitForHostRows: input.waitForHostRows === true,
      ...(input.verify ? { verify: input.verify } : {}),
      ...(input.alsoWhenBooked ? { alsoWhenBooked: input.alsoWhenBooked } : {}),
      allocationId: input.allocationId ?? newId('alloc'),
      reservationId: input.reservationId,
      nodeId: fit.nodeId,
      deviceIds: fit.deviceIds,
      resources: fit.resources,
      start: new Date(window.start),
      end: new Date(window.end),
      bookedUntil: input.bookedUntil !== undefined ? new Date(input.bookedUntil) : undefined,
    });
  } catch (error) {
    if (error instanceof BookingConflict) throw new PlacementContention();
    throw error;
  }
}

/** How far past a window the bookings of a cached node are read, so later windows reuse it. */
export const cachedHorizonMs = 86_400_000;

/**
 * A large pool's candidates for one round. `warm`: the nodes this process booked or read last,
 * from the placer's node cache only (no read; none when they expired). `sample`: a random sample
 * of the pool's schedulable nodes and the warm ones, from the cache where it has them (bookings
 * covering the window), the rest read now and cached.
 */
async function sampledNodes(
  db: Db,
  input: { poolId: string; request: PlacementRequest; window: Interval; caches: AdmissionCaches },
  round: 'warm' | 'sample' = 'sample',
): Promise<PlacerNode[]> {
  const { poolId, request, window, caches } = input;
  const warm = caches.placerNodes.warmNodes(poolId);
  if (round === 'warm') return caches.placerNodes.lookup(poolId, request.deviceClass, warm, window).cached;
  // Where the pool's last whole read found room, when it was lately: in a mostly booked pool a
  // sample of every schedulable node would rarely hold a fit.
  const sample =
    caches.placerNodes.roomSample(poolId, request.deviceClass, window, request.count, sampleSize) ??
    (await sampleNodeIds(db, poolId, caches, sampleSize));
  const ids = [...new Set([...sample, ...warm])];
  const { cached, missing } = caches.placerNodes.lookup(poolId, request.deviceClass, ids, window);
  if (missing.length === 0) return cached;
  const readHorizon = { start: window.start, end: window.end + cachedHorizonMs };
  // monotonic: a node this process booked on while the read ran is known better than the read knew it
  const readStartedAt = performance.now();
  const read = await loadPlacerNodes(db, {
    poolId,
    deviceClass: request.deviceClass,
    horizon: readHorizon,
    sample: missing,
  });
  return [
    ...cached,
    ...caches.placerNodes.store(poolId, request.deviceClass, read, readHorizon, true, readStartedAt),
  ];
}

/**
 * A sample that found no fit. Once samples came back empty often enough (the pool is mostly
 * booked: random nodes rarely have room), the pool is read whole in the background and its room
 * then steers the samples. Counting every sample read instead read a pool with room to spare whole
 * every few seconds (one whole read of 10,000 nodes costs about as much PostgreSQL time as 1,500
 * sample reads; bench/README.md, 2026-12-05). Not from a transaction, whose connection is the caller's.
 */
async function noteEmptySample(
  db: Db,
  input: { poolId: string; request: PlacementRequest; window: Interval; caches: AdmissionCaches },
): Promise<void> {
  const { poolId, request, window, caches } = input;
  const empty = caches.placerNodes.countEmptySample(poolId, request.deviceClass);
  if (db.isTransaction) return;
  const nodes = (await schedulableNodeIds(db, poolId, caches)).length;
  if (empty * sampleSize >= nodes * emptySampledShareForWholeRead) {
    readRoom(db, { ...input, horizon: { start: window.start, end: window.end + cachedHorizonMs } });
  }
}

/**
 * Reads a large pool whole for its room (a statement of its own, in the background), unless a
 * whole read of it runs already. Its failure only leaves the pool without a room for now: the
 * samples go on without it, and the next empty sample past the count tries again.
 */
function readRoom(
  db: Db,
  input: {
    poolId: string;
    request: PlacementRequest;
    window: Interval;
    horizon: Interval;
    caches: AdmissionCaches;
  },
): void {
  const { poolId, request, window, horizon, caches } = input;
  if (caches.placerNodes.wholeReadCovering(poolId, request.deviceClass, window)) return;
  const nodes = loadPlacerNodes(db, { poolId, deviceClass: request.deviceClass, horizon });
  caches.placerNodes.shareWholeRead(
    poolId,
    request.deviceClass,
    { startedAt: performance.now(), horizon, window, nodes },
    (node, w) => freeAtoms(node, request, w),
  );
  nodes.catch(() => undefined);
}

/** What a booking from a possibly cached node re-checks: the atoms as seen and the labels needed. */
export function verification(node: PlacerNode, fit: NodeFit, request: PlacementRequest): NodeVerification {
  const chosen = new Set(fit.deviceIds);
  return {
    deviceClass: request.deviceClass,
    attributes: Object.fromEntries(
      node.devices.filter((d) => chosen.has(d.id)).map((d) => [d.id, d.attributes]),
    ),
    labels: labelsNeeded(node, request),
  };
}

/**
 * Finds a node for the request over `window` and books it in the caller's transaction: best fit
 * first, each candidate's atoms locked with `wait: false` (never waiting while holding locks),
 * re-checked against the bookings under the lock, then inserted through the EXCLUDE constraint
 * and the scalar guard. A lost race moves on to the next candidate and never double-books.
 * Throws PlacementContention when only lock contention stood in the way.
 *
 * With `atOnce`, `trx` is the database itself and each try is a statement of its own (its own
 * transaction) that also makes the writes `atOnce(fit)` gives: only the rounds that hold no lock
 * across statements run (a large pool's warm and sampled nodes, a small pool's whole read, never
 * waiting for a lock), and where the transactional path would go on (read the whole large pool,
 * wait behind concurrent bookers, explain a NoFit, retry a lost race) it answers not placed with
 * an empty message instead, as it does when the writes were refused: nothing was written, and the
 * caller places the request the transactional way.
 */
export async function findAndBook(
  trx: Trx | Db,
  input: {
    poolId: string;
    request: PlacementRequest;
    window: Interval;
    durationMs: number;
    reservationId: string;
    /** Admission's caches; without them the schedulable list is read once for this call. */
    caches?: AdmissionCaches;
    /** Nodes not to book (BookingRepair: the bad nodes and those a gang member already holds). */
    excludeNodeIds?: readonly string[];
    /** The new allocation's id (default a fresh one), so the caller can refer to it. */
    allocationId?: string;
    /** One statement per try, with these writes, outside any transaction (see above). */
    atOnce?: (fit: NodeFit) => WritesWhenBooked;
  },
): Promise<
  { placed: true; fit: NodeFit } | { placed: false; message: string; earliestStart: number | null }
> {
  // monotonic: orders this placement against the whole reads of the pool that others began
  const began = performance.now();
  const caches = input.caches ?? createAdmissionCaches();
  const atOnce = input.atOnce;
  const notPlacedAtOnce = { placed: false as const, message: '', earliestStart: null };
  const large = (await schedulableNodeIds(trx, input.poolId, caches)).length > wholePoolLimit;
  // The whole pool is read over the counter-offer's horizon, so a NoFit needs no second read.
  const horizon = {
    start: input.window.start,
    end: input.window.start + counterOfferHorizonMs + input.durationMs,
  };
  const excluded = new Set(input.excludeNodeIds ?? []);
  let contended = false;
  // A large pool: the warm nodes from the cache, two samples, then the whole pool, read once for
  // all the placements that need it at the same time (PlacerNodeCache.wholeReadSince).
  const rounds = !large
    ? (['whole'] as const)
    : atOnce
      ? (['warm', 'sample'] as const)
      : (['warm', 'sample', 'sample', 'whole'] as const);
  // A statement of its own holds its locks only while it runs: its claims end with it.
  const claims = atOnce ? [] : openClaims.get(trx);
  for (const round of rounds) {
    const whole = round === 'whole';
    let loaded: PlacerNode[];
    // Read by this transaction (not from the cache, nor by a concurrent placement).
    let readHere = false;
    if (whole) {
      const read = () =>
        loadPlacerNodes(trx, { poolId: input.poolId, deviceClass: input.request.deviceClass, horizon });
      const shared = large
        ? await caches.placerNodes.wholeReadSince(input.poolId, input.request.deviceClass, {
            began,
            window: input.window,
            horizon,
            read,
            freeAtoms: (node, window) => freeAtoms(node, input.request, window),
          })
        : { nodes: read(), own: true };
      readHere = shared.own;
      // A concurrent placement's read that failed is its own to answer: this one reads for itself.
      const nodes = shared.own ? await shared.nodes : await shared.nodes.catch(() => null);
      if (nodes) loaded = nodes;
      else {
        loaded = await read();
        readHere = true;
      }
    } else loaded = await sampledNodes(trx, { ...input, caches }, round);
    // Nodes this process is booking in other open transactions are left to them (choosing the
    // same best fit would only lose the race for its locks), except where a NoFit is answered.
    const claimedElsewhere = (nodeId: string) =>
      (!whole || atOnce !== undefined) &&
      claims !== undefined &&
      caches.placerNodes.claimed(input.poolId, nodeId);
    const nodes = loaded.filter((n) => !excluded.has(n.id) && !claimedElsewhere(n.id));
    // A whole read another placement of the same shape found no fit in answers this one alike.
    const known =
      whole && !atOnce && !contended && nodes.length === loaded.length
        ? knownNoFit(loaded, input)
        : undefined;
    if (known) return { placed: false, message: known.message, earliestStart: known.earliestStart };
    // A sampled round books one of the first fits and explains nothing: its tightest nodes suffice.
    const plan = whole ? planPlacement(nodes, input.request, input.window, input.reservationId) : null;
    const fits = plan ? plan.fits : tightestFits(nodes, input.request, input.window, input.reservationId);
    if (fits.length === 0) {
      if (round === 'sample') await noteEmptySample(trx, { ...input, caches });
      if (!plan) continue;
      if (contended || atOnce) break;
      const outcome =
        nodes.length === loaded.length
          ? sharedNoFitOutcome(loaded, plan, input)
          : noFitOutcome(nodes, plan, input);
      return { placed: false, message: outcome.message, earliestStart: outcome.earliestStart };
    }
    const byId = new Map(nodes.map((n) => [n.id, n]));
    const locked: NodeFit[] = [];
    for (const planned of fits.slice(0, 16)) {
      // Claimed since the plan, by a placement that ran while this one waited on a statement.
      if (claimedElsewhere(planned.nodeId)) continue;
      const node = byId.get(planned.nodeId)!;
      // Booked on by this process since the plan (its bookings are added to the cached node at
      // once): planned again as the node is now, instead of a try its re-check would refuse.
      const now = fitNode(node, input.request, input.window);
      if (!('fit' in now)) continue;
      const fit = now.fit;
      const release = claims ? caches.placerNodes.claim(input.poolId, fit.nodeId) : undefined;
      const outcome = await tryBook(trx, {
        fit,
        window: input.window,
        reservationId: input.reservationId,
        allocationId: input.allocationId,
        // A node not read by this transaction: the booking re-checks what the plan relied on.
        ...(readHere ? {} : { verify: verification(node, fit, input.request) }),
        ...(atOnce ? { alsoWhenBooked: atOnce(fit) } : {}),
      }).catch((error: unknown) => {
        if (!atOnce) throw error;
        // On its own, a statement refused by the EXCLUDE constraint failed alone: the node was
        // booked since. Any other constraint it broke (the reservation was placed meanwhile) is
        // the transactional path's to answer, and so is a deadlock: this statement holds the
        // node's rows while it waits for the reservation's, which a second call with the same
        // key may hold in placeDraft while it waits for that node's rows (PostgreSQL then rolls
        // one of them back; placeDraft retries, and this call joins it there).
        if (error instanceof PlacementContention) return 'stale' as const;
        if (String((error as { code?: unknown })?.code ?? '').startsWith('23')) return 'refused' as const;
        if (isTransientConflict(error)) return 'refused' as const;
        throw error;
      });
      // Not booked in a transaction: any host rows it took stay locked to its end, so keep the claim.
      if (release && !atOnce && outcome !== 'stale') claims?.push(release);
      else release?.();
      if (outcome === 'booked') {
        caches.placerNodes.recordBooking(input.poolId, input.request.deviceClass, {
          nodeId: fit.nodeId,
          deviceIds: fit.deviceIds,
          window: input.window,
          resources: fit.resources,
        });
        return { placed: true, fit };
      }
      if (outcome === 'refused') return notPlacedAtOnce;
      if (outcome === 'stale') caches.placerNodes.forget(input.poolId, input.request.deviceClass, fit.nodeId);
      if (outcome === 'locked') locked.push(fit);
    }
    if (locked.length > 0) contended = true;
    // In a large pool the next round samples other nodes; in the whole pool, only concurrent
    // bookers stood in the way: queue behind them (so a small pool fills exactly instead of
    // answering contention).
    if (!whole || atOnce) continue;
    for (const fit of locked) {
      const outcome = await tryBook(trx, {
        fit,
        window: input.window,
        reservationId: input.reservationId,
        allocationId: input.allocationId,
        waitForHostRows: true,
      });
      if (outcome === 'booked') return { placed: true, fit };
    }
  }
  if (atOnce) return notPlacedAtOnce;
  // Every fit was taken or locked by concurrent placements: roll back and try again.
  throw new PlacementContention();
}

/** The pauses between a placement's attempts (withPlacementTransaction). */
const contentionBackoff = { minMs: 4, maxMs: 250 };

/**
 * Runs `fn` in a transaction, again (up to `attempts` times, after a pause doubling to 250 ms) when it
 * lost a placement race (PlacementContention) or PostgreSQL broke a deadlock or a serialization
 * conflict. Any other error ends it. Out of attempts, contention is answered as UNAVAILABLE with
 * `retryAfterSeconds` (PlacementContention), never INTERNAL.
 */
export async function withPlacementTransaction<T>(
  db: Db,
  fn: (trx: Trx) => Promise<T>,
  attempts = 12,
): Promise<T> {
  for (let attempt = 1; ; attempt++) {
    const claims: Array<() => void> = [];
    const releaseClaims = () => {
      for (const release of claims) release();
    };
    try {
      const result = await db.transaction().execute((trx) => {
        openClaims.set(trx, claims);
        return fn(trx);
      });
      // The transaction has ended, and its locks with it.
      releaseClaims();
      return result;
    } catch (error) {
      releaseClaims();
      const retryable = error instanceof PlacementContention || isTransientConflict(error);
      if (!retryable) throw error;
      if (attempt >= attempts) {
        throw error instanceof PlacementContention
          ? error
          : new PlacementContention(
              `the placement met ${attempts} deadlocks or serialization conflicts in a row`,
            );
      }
      // Doubling from 4 ms to 250 ms: a lock holder slow to commit (a release on a loaded
      // machine) is waited out for about a second in all, where eight short pauses (about
      // 130 ms) answered contention to a lone create.
      await new Promise((resolve) => setTimeout(resolve, jitteredBackoffMs(attempt, contentionBackoff)));
    }
  }
}

/**
 * What a create would do now, booking nothing (capacity.preview): a sample of a large pool first
 * (the nodes a create's first round would look at, from and into the placer's node cache),
 * the whole pool when the sample has no fit, with the counter-offer when nothing fits.
 */
export async function previewPlacement(
  db: Db,
  input: { poolId: string; request: PlacementRequest; window: Interval; durationMs: number },
  caches: AdmissionCaches = createAdmissionCaches(),
): Promise<PlanOutcome> {
  if ((await schedulableNodeIds(db, input.poolId, caches)).length > wholePoolLimit) {
    // Through the placer's node cache, so a create that follows reads none of these nodes again.
    const nodes = await sampledNodes(db, { ...input, caches });
    const plan = planPlacement(nodes, input.request, input.window);
    if (plan.fits.length > 0) return { fits: true, fit: plan.fits[0]!, window: input.window };
  }
  const { nodes: _nodes, ...outcome } = await planWholePool(db, input);
  return outcome;
}
