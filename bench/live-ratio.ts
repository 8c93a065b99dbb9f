// The placement rate with live reservations over the rate with none, of bench/scale.ts (issue 14:
// at least 0.8, inline and pool-lease). Measured on two pools of the same shape, one empty and one
// holding the live reservations, in alternating slices (empty, live, then live, empty, …): the
// rates measured one after the other, minutes apart, moved with the shared machine's speed (its
// speed probe went from 28.8 to 90.8 ms between the two loads of one run, bench/README.md,
// 2026-12-07), as the guarded booking rate did before its loads alternated. Every slice runs on an
// API of its own (fresh admission caches), and the reservations it placed are ended after it, so
// each slice finds its pool as the one before did.

import type { Db } from '../core/database.ts';
import type { Logger } from '../core/logger.ts';
import { registerReadyNodes } from '../db/nodes/fleet.ts';
import {
  cpuMeter,
  endPlacedReservations,
  insertBenchPool,
  insertLiveReservations,
  type LoadResult,
  type PlacerKind,
  startPlacementApi,
  startPlacerInChild,
  usePlacer,
} from './support.ts';

/** One placer's rates on the empty pool and the live one, over all slices. */
export interface LiveRatioOfPlacer {
  perSecondEmpty: number;
  perSecondLive: number;
  ratio: number | null;
  /** Each slice pair's live rate over its empty rate. */
  ratioBySlice: (number | null)[];
  p99MsEmpty: number;
  p99MsLive: number;
  cpuMsPerPlacementEmpty: number | null;
  cpuMsPerPlacementLive: number | null;
}

export interface LiveRatio {
  count: number;
  nodes: number;
  slices: number;
  sliceSeconds: number;
  /** Seconds the bulk write of the live reservations took. */
  writeSeconds: number;
  inline: LiveRatioOfPlacer;
  poolLease: LiveRatioOfPlacer;
}

interface Slice {
  load: LoadResult;
  cpuSeconds: number;
}

const ratio = (a: number, b: number) => (b === 0 ? null : Number((a / b).toFixed(3)));

/**
 * Loads a second pool of `nodeCount` nodes, writes `count` live reservations on it, then measures
 * `slices` slice pairs of each placer, `sliceSeconds` each, on `emptyPoolId` (which the caller has
 * emptied) and on the live pool. `settle` vacuums, analyzes and checkpoints after each slice's
 * reservations ended.
 */
export async function measureLiveRatio(input: {
  db: Db;
  /** The database `db` reaches (the placer child connects to it). */
  databaseUrl: string;
  log: Logger;
  postmasterPid: number | null;
  emptyPoolId: string;
  nodeCount: number;
  count: number;
  clients: number;
  gpus: number;
  slices: number;
  sliceSeconds: number;
  settle: () => Promise<unknown>;
  progress: (line: string) => void;
}): Promise<LiveRatio> {
  const { db, log, progress } = input;
  progress(`live: loading a second pool of ${input.nodeCount} nodes for the live reservations`);
  const { siteId, poolId: livePoolId } = await insertBenchPool(db, { name: 'h100-live' });
  await registerReadyNodes(db, { siteId, poolId: livePoolId, count: input.nodeCount, namePrefix: 'live' });
  // The templates the bulk write copies: reservations admission itself placed on the live pool.
  const templates = await startPlacementApi(db, {
    poolId: livePoolId,
    quotaGpus: input.nodeCount * 8,
    log,
    tenantPrefix: 'live-templates',
  });
  await templates.stop();
  // monotonic: how long the bulk write takes (a progress figure only)
  const writeStarted = performance.now();
  const written = await insertLiveReservations(db, {
    poolId: livePoolId,
    templateIds: templates.warmUpIds,
    count: input.count,
  });
  const writeSeconds = Number(((performance.now() - writeStarted) / 1000).toFixed(1));
  await input.settle();
  progress(
    `live: ${written.written} live reservations written on ${written.nodes} nodes in ${writeSeconds} s; ` +
      `${input.slices} slice pairs of ${input.sliceSeconds} s per placer, alternating the empty pool and the live one`,
  );

  const slice = async (
    placer: PlacerKind,
    poolId: string,
    tenantPrefix: string,
    seconds = input.sliceSeconds,
  ): Promise<Slice> => {
    if (placer === 'pool-lease') await usePlacer(db, poolId, 'pool-lease');
    const api = await startPlacementApi(db, { poolId, quotaGpus: input.nodeCount * 8, log, tenantPrefix });
    // The pool-lease placer in a process of its own, as a worker runs it beside the API.
    const placerChild = placer === 'pool-lease' ? await startPlacerInChild({ url: input.databaseUrl }) : null;
    try {
      const meter = cpuMeter(input.postmasterPid, { alsoNodePids: placerChild ? [placerChild.pid] : [] });
      const load = await api.loadInChild(input.clients, seconds, {
        gpus: input.gpus,
        duration: '8h',
        ...(placer === 'pool-lease' ? { waitMs: 30_000 } : {}),
      });
      const cpu = meter(load.committed);
      return { load, cpuSeconds: cpu.nodeSeconds + cpu.postgresSeconds };
    } finally {
      await placerChild?.stop();
      await api.stop();
      if (placer === 'pool-lease') await usePlacer(db, poolId, 'inline');
      await endPlacedReservations(db, { tenantPrefix });
      await input.settle();
    }
  };

  const measure = async (placer: PlacerKind): Promise<LiveRatioOfPlacer> => {
    const empty: Slice[] = [];
    const live: Slice[] = [];
    // One short slice on each pool first, not counted: the first load after the bulk write ran
    // slower whichever pool it was on (349/s where the same pool's next slices measured 461 and 539).
    for (const poolId of [input.emptyPoolId, livePoolId])
      await slice(placer, poolId, `warm-${placer}-${poolId}`, 2);
    for (let i = 0; i < input.slices; i++) {
      // Empty first in even pairs, live first in odd ones: a drift in the machine's speed weighs on both.
      const order = i % 2 === 0 ? (['empty', 'live'] as const) : (['live', 'empty'] as const);
      for (const which of order) {
        const poolId = which === 'empty' ? input.emptyPoolId : livePoolId;
        const result = await slice(placer, poolId, `${which}-${placer}-${i}`);
        (which === 'empty' ? empty : live).push(result);
        progress(
          `live: ${placer} slice ${i + 1}/${input.slices} on the ${which} pool: ${result.load.perSecond}/s ` +
            `(p99 ${result.load.p99Ms} ms, ${result.load.refused} not placed, errors ${JSON.stringify(result.load.errors)})`,
        );
      }
    }
    const rate = (slices: Slice[]) =>
      Math.round(
        slices.reduce((n, s) => n + s.load.committed, 0) / slices.reduce((n, s) => n + s.load.seconds, 0),
      );
    const median = (values: number[]) => [...values].sort((a, b) => a - b)[Math.floor(values.length / 2)]!;
    const cpuMs = (slices: Slice[]) => {
      const placed = slices.reduce((n, s) => n + s.load.committed, 0);
      return placed === 0
        ? null
        : Number(((slices.reduce((n, s) => n + s.cpuSeconds, 0) * 1000) / placed).toFixed(2));
    };
    const result: LiveRatioOfPlacer = {
      perSecondEmpty: rate(empty),
      perSecondLive: rate(live),
      ratio: ratio(rate(live), rate(empty)),
      ratioBySlice: live.map((s, i) => ratio(s.load.perSecond, empty[i]!.load.perSecond)),
      p99MsEmpty: median(empty.map((s) => s.load.p99Ms)),
      p99MsLive: median(live.map((s) => s.load.p99Ms)),
      cpuMsPerPlacementEmpty: cpuMs(empty),
      cpuMsPerPlacementLive: cpuMs(live),
    };
    progress(
      `live: ${placer}: ${result.perSecondEmpty}/s on the empty pool, ${result.perSecondLive}/s with ` +
        `${written.written} live reservations; ratio ${result.ratio} (by slice ${result.ratioBySlice.join(', ')}); ` +
        `CPU per placement ${result.cpuMsPerPlacementEmpty} → ${result.cpuMsPerPlacementLive} ms`,
    );
    return result;
  };

  const inline = await measure('inline');
  const poolLease = await measure('pool-lease');
  return {
    count: written.written,
    nodes: written.nodes,
    slices: input.slices,
    sliceSeconds: input.sliceSeconds,
    writeSeconds,
    inline,
    poolLease,
  };
}
