/**
 * Preemption decision latency with 1,000 live spot reservations in the pool: 250 nodes of 8 GPUs,
 * every GPU held by an active spot reservation of 2 GPUs (4 per node). A regular request for 4
 * GPUs does not fit, so each decision is the whole placement transaction as the lifecycle runs it
 * (`placeReservation`: the placer's NoFit over the pool with its counter-offer, then the spot
 * holdings read, the choice of the fewest and most recently started, the notice written to two
 * spot reservations and their NodeSpecs, and the regular booking from the deadline), rolled back
 * each time so every decision faces the same 1,000. The baseline, measured in the same run: the
 * same placement for a spot request, which never preempts (the NoFit decision alone). Also the
 * pure choice (`choosePreemption`) over the loaded pool, without I/O.
 * Usage: node --import tsx bench/preemption.ts [--nodes 250] [--per-node 4] [--runs 60]
 */
import { loadavg } from 'node:os';
import { parseArgs } from 'node:util';
import { sql } from 'kysely';
import { placementRequestOf } from '../db/allocations/placement.ts';
import { loadPlacerNodes } from '../db/allocations/placement-load.ts';
import { tryInsertAllocationWithBookings } from '../db/allocations/try-book.ts';
import { insertPool, insertSite, registerReadyNodes } from '../db/nodes/fleet.ts';
import { placeReservation } from '../db/reservations/placement.ts';
import { loadSpotHoldings } from '../db/reservations/preemption.ts';
import { newId } from '../domain/ids.ts';
import { choosePreemption } from '../domain/preemption.ts';
import type { NormalizedRequest } from '../domain/reservation-request.ts';
import { benchDatabase, percentile } from './support.ts';

const { values } = parseArgs({
  options: {
    nodes: { type: 'string', default: '250' },
    'per-node': { type: 'string', default: '4' },
    runs: { type: 'string', default: '60' },
  },
});
const nodeCount = Number(values.nodes);
const perNode = Number(values['per-node']);
const runs = Number(values.runs);
const gpusPerSpot = 8 / perNode;

const bench = await benchDatabase('preemption', { max: 4 });
const db = bench.db;

function request(poolId: string, gpus: number, spot: boolean): NormalizedRequest {
  return {
    poolId,
    devices: [{ class: 'gpu', count: gpus, topology: 'any' }],
    duration: '7200000ms',
    durationMs: 7_200_000,
    binding: 'hold',
    ...(spot ? { spot: true } : {}),
  };
}

async function insertReservation(
  poolId: string,
  input: { state: 'active' | 'pending'; gpus: number; spot: boolean; during?: string },
): Promise<string> {
  const id = newId('rsv');
  await db
    .insertInto('reservations')
    .values({
      id,
      tenant_id: 'acme',
      pool_id: poolId,
      owner_identity_id: 'idn_bench',
      idempotency_key: id,
      request: JSON.stringify(request(poolId, input.gpus, input.spot)),
      request_hash: 'bench',
      state: input.state,
      duration_ms: 7_200_000,
      spot: input.spot,
      during: input.during ?? null,
      pending_since: input.state === 'pending' ? sql<Date>`compute_now()` : null,
    })
    .execute();
  return id;
}

try {
  const siteId = await insertSite(db, { name: 'bench-site', region: 'eu-1' });
  const poolId = await insertPool(db, { siteId, ownerTenantId: 'tnt_root', name: 'bench', gpuModel: 'h100' });
  const nodes = await registerReadyNodes(db, { siteId, poolId, count: nodeCount });
  const { rows } = await sql<{ now: Date }>`SELECT compute_now() AS now`.execute(db);
  const now = rows[0]!.now.getTime();
  let spots = 0;
  for (const node of nodes) {
    for (let k = 0; k < perNode; k++) {
      // Started a little apart, so "the most recently started" has something to choose.
      const start = new Date(now - 3_600_000 + spots * 1_000);
      const end = new Date(now + 7_200_000);
      const during = `[${start.toISOString()},${end.toISOString()})`;
      const id = await insertReservation(poolId, { state: 'active', gpus: gpusPerSpot, spot: true, during });
      const allocationId = newId('alloc');
      const outcome = await db.transaction().execute((trx) =>
        tryInsertAllocationWithBookings(trx, {
          allocationId,
          reservationId: id,
          nodeId: node.id,
          deviceIds: node.deviceIds.slice(k * gpusPerSpot, (k + 1) * gpusPerSpot),
          resources: {},
          start,
          end,
        }),
      );
      if (outcome !== 'booked') throw new Error(`spot ${id} on ${node.id} was not booked (${outcome})`);
      await db
        .updateTable('allocations')
        .set({ state: 'bound', bound_at: start })
        .where('id', '=', allocationId)
        .execute();
      spots++;
    }
  }
  const regularId = await insertReservation(poolId, { state: 'pending', gpus: 4, spot: false });
  const spotId = await insertReservation(poolId, { state: 'pending', gpus: 4, spot: true });

  /** One placement decision in a transaction that is rolled back; answers its outcome and milliseconds. */
  const rollback = new Error('rollback');
  async function decide(reservationId: string): Promise<{ ms: number; outcome: string; noticed: number }> {
    let outcome = '';
    let noticed = 0;
    const t0 = performance.now();
    let ms = 0;
    await db
      .transaction()
      .execute(async (trx) => {
        const placed = await placeReservation(trx, reservationId);
        ms = performance.now() - t0;
        outcome = placed.outcome;
        noticed = placed.outcome === 'placed' ? (placed.preemption?.noticed.length ?? 0) : 0;
        throw rollback;
      })
      .catch((error) => {
        if (error !== rollback) throw error;
      });
    return { ms, outcome, noticed };
  }

  // Warm-up (prepared statements, JIT), then alternate the two so load drifts hit both alike.
  for (let i = 0; i < 5; i++) {
    await decide(regularId);
    await decide(spotId);
  }
  const preempting: number[] = [];
  const baseline: number[] = [];
  const loadBefore = loadavg()[0]!;
  for (let i = 0; i < runs; i++) {
    const p = await decide(regularId);
    if (p.outcome !== 'placed' || p.noticed !== 2)
      throw new Error(`expected a preemption of 2, got ${JSON.stringify(p)}`);
    preempting.push(p.ms);
    const b = await decide(spotId);
    if (b.outcome !== 'pending') throw new Error(`a spot request must not preempt, got ${b.outcome}`);
    baseline.push(b.ms);
  }
  const loadAfter = loadavg();

  // The pure choice alone, over the same pool as the placer loads it.
  const horizon = { start: now + 120_000, end: now + 120_000 + 7_200_000 };
  const loaded = await loadPlacerNodes(db, { poolId, deviceClass: 'gpu', horizon });
  const holdings = await loadSpotHoldings(db, { poolId, horizon });
  const placement = placementRequestOf(request(poolId, 4, false));
  const reads = { holdings: [] as number[], nodes: [] as number[] };
  for (let i = 0; i < Math.min(runs, 20); i++) {
    let t0 = performance.now();
    await loadSpotHoldings(db, { poolId, horizon });
    reads.holdings.push(performance.now() - t0);
    t0 = performance.now();
    await loadPlacerNodes(db, { poolId, deviceClass: 'gpu', horizon });
    reads.nodes.push(performance.now() - t0);
  }
  const pure: number[] = [];
  for (let i = 0; i < runs; i++) {
    const t0 = performance.now();
    const choice = choosePreemption({ nodes: loaded, holdings, request: placement, window: horizon });
    pure.push(performance.now() - t0);
    if (choice?.reservationIds.length !== 2) throw new Error('the pure choice must pick 2');
  }

  const stats = (xs: number[]) => {
    const s = [...xs].sort((a, b) => a - b);
    return { p50: percentile(s, 50), p99: percentile(s, 99), max: s[s.length - 1]! };
  };
  const p = stats(preempting);
  const b = stats(baseline);
  const c = stats(pure);
  const f = (n: number) => n.toFixed(1);
  console.log(
    JSON.stringify(
      {
        nodes: nodeCount,
        liveSpotReservations: spots,
        holdingsLoaded: holdings.length,
        runs,
        preemptionDecisionMs: { p50: f(p.p50), p99: f(p.p99), max: f(p.max) },
        noFitBaselineMs: { p50: f(b.p50), p99: f(b.p99), max: f(b.max) },
        ratioP50: (p.p50 / b.p50).toFixed(2),
        pureChoiceMs: { p50: f(c.p50), p99: f(c.p99) },
        readSpotHoldingsMsP50: f(stats(reads.holdings).p50),
        readPlacerNodesMsP50: f(stats(reads.nodes).p50),
        loadAverage: { before: loadBefore.toFixed(2), after: loadAfter.map((l) => l.toFixed(2)) },
      },
      null,
      2,
    ),
  );
} finally {
  await bench.dispose();
}
