// The lifecycle start backlog of bench/scale.ts (issue 14): a P1-like load whose creates start
// real lifecycles on a Temporal server, with the worker of bench/lifecycle-worker.ts in a child
// process, sampling every 500 ms how many placed reservations have no started workflow yet.

import { fork } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { fileURLToPath } from 'node:url';
import { sql } from 'kysely';
import type { Db } from '../core/database.ts';
import type { ReservationLifecycle } from '../core/deps.ts';
import type { Logger } from '../core/logger.ts';
import { connectTemporal } from '../temporal/client.ts';
import { createTemporalLifecycle } from '../temporal/lifecycle.ts';
import { benchTemporal, cpuProfileArgs, runLoad, startPlacementApi } from './support.ts';

export interface LifecycleBacklog {
  placementsPerSecond: number;
  /** Workflow starts (signal-with-start answered) per second over the load. */
  startsPerSecond: number;
  /** Placed reservations whose signal-with-start had not answered yet, over the 500 ms samples. */
  maxBacklog: number;
  meanBacklog: number;
  /** Lifecycles that had looked at their reservation once (`lifecycle_started_at`) per second. */
  lookedPerSecond: number;
  /** Placed reservations whose workflow had not looked at them yet, over the same samples. */
  maxUnlooked: number;
  meanUnlooked: number;
  /** Seconds after the load until every placed reservation's lifecycle had looked (null: not within 60 s). */
  drainSeconds: number | null;
  /** Lifecycles that looked once a second after the load, until they all had (or for 60 s). */
  lookedPerSecondAfterLoad: number;
  failedStarts: number;
  samples: number;
  p50Ms: number;
  p99Ms: number;
  errors: Record<string, number>;
}

export async function measureLifecycleBacklog(input: {
  db: Db;
  databaseUrl: string;
  poolId: string;
  quotaGpus: number;
  clients: number;
  seconds: number;
  gpus: number;
  log: Logger;
  progress: (line: string) => void;
}): Promise<LifecycleBacklog> {
  const { db, log, progress } = input;
  progress('lifecycles: starting Temporal and a worker');
  const { address, stop: stopTemporal } = await benchTemporal(log);
  const temporal = await connectTemporal({ address });
  const taskQueue = `bench-scale-${randomBytes(4).toString('hex')}`;
  const child = fork(
    fileURLToPath(new URL('./lifecycle-worker.ts', import.meta.url)),
    [JSON.stringify({ databaseUrl: input.databaseUrl, address, taskQueue })],
    {
      execArgv: [...cpuProfileArgs(process.execArgv), '--import', 'tsx'],
      stdio: ['ignore', 'inherit', 'inherit', 'ipc'],
    },
  );
  try {
    await new Promise((resolve) => child.once('message', resolve));
    const temporalLifecycle = createTemporalLifecycle(temporal.client, { taskQueue });
    let started = 0;
    let failedStarts = 0;
    // The API's lifecycle, counting each start once Temporal answered it (the workflow exists).
    const lifecycle: ReservationLifecycle = {
      start: async (r) => {
        try {
          await temporalLifecycle.start(r);
          started++;
        } catch (error) {
          failedStarts++;
          throw error;
        }
      },
      running: (ids) => temporalLifecycle.running(ids),
      signal: (id, s) => temporalLifecycle.signal(id, s),
      wakePool: (id) => temporalLifecycle.wakePool(id),
    };
    const api = await startPlacementApi(db, {
      poolId: input.poolId,
      quotaGpus: input.quotaGpus,
      log,
      tenantPrefix: 'lifecycle',
      lifecycle,
    });
    // Placed (charged) reservations of this part's tenants, and those whose lifecycle has not looked.
    const count = async () => {
      const { rows } = await sql<{ placed: number; unlooked: number }>`
        SELECT count(*)::int AS placed, count(*) FILTER (WHERE r.lifecycle_started_at IS NULL)::int AS unlooked
        FROM quota_charges q JOIN reservations r ON r.id = q.reservation_id
        WHERE q.tenant_id LIKE 'lifecycle-%' AND q.resource = 'gpu' AND q.refunded_at IS NULL`.execute(db);
      return { ...rows[0]!, started };
    };
    const samples: Array<{ placed: number; unlooked: number; started: number }> = [];
    let sampling = true;
    const sampler = (async () => {
      while (sampling) {
        samples.push(await count());
        await new Promise((resolve) => setTimeout(resolve, 500));
      }
    })();
    const first = await count();
    const t0 = performance.now();
    progress(
      `lifecycles: ${input.clients} clients placing inline with lifecycle starts for ${input.seconds} s`,
    );
    const load = await runLoad(input.clients, input.seconds, (client) =>
      api.place(client, { gpus: input.gpus, duration: '8h' }),
    );
    const loadSeconds = (performance.now() - t0) / 1000;
    const end = await count();
    sampling = false;
    await sampler;
    // Until every lifecycle looked at its reservation (at most a minute).
    const t1 = performance.now();
    let drainSeconds: number | null = null;
    let last = end;
    while (performance.now() - t1 < 60_000) {
      last = await count();
      if (last.unlooked === 0 && last.started >= last.placed) {
        drainSeconds = Number(((performance.now() - t1) / 1000).toFixed(1));
        break;
      }
      await new Promise((resolve) => setTimeout(resolve, 250));
    }
    // The rate at which lifecycles looked once the load stopped: Temporal's and its worker's own.
    const lookedAfterLoad = Math.round((end.unlooked - last.unlooked) / ((performance.now() - t1) / 1000));
    await api.stop();
    const backlog = samples.map((s) => Math.max(0, s.placed - s.started));
    const unlooked = samples.map((s) => s.unlooked);
    const mean = (xs: number[]) =>
      xs.length === 0 ? 0 : Number((xs.reduce((a, b) => a + b, 0) / xs.length).toFixed(1));
    const result: LifecycleBacklog = {
      placementsPerSecond: load.perSecond,
      startsPerSecond: Math.round((end.started - first.started) / loadSeconds),
      maxBacklog: Math.max(0, ...backlog),
      meanBacklog: mean(backlog),
      lookedPerSecond: Math.round(
        (end.placed - end.unlooked - (first.placed - first.unlooked)) / loadSeconds,
      ),
      maxUnlooked: Math.max(0, ...unlooked),
      meanUnlooked: mean(unlooked),
      drainSeconds,
      lookedPerSecondAfterLoad: lookedAfterLoad,
      failedStarts,
      samples: samples.length,
      p50Ms: load.p50Ms,
      p99Ms: load.p99Ms,
      errors: load.errors,
    };
    progress(
      `lifecycles: ${result.placementsPerSecond} placements/s, ${result.startsPerSecond} starts/s, backlog without a ` +
        `started workflow max ${result.maxBacklog} mean ${result.meanBacklog}; not yet looked at max ` +
        `${result.maxUnlooked} mean ${result.meanUnlooked} (${result.lookedPerSecond}/s looked); drained ` +
        `${drainSeconds === null ? 'not within 60 s' : `${drainSeconds} s after the load`} ` +
        `(${lookedAfterLoad}/s looked after it); p50 ${load.p50Ms} ms, ` +
        `p99 ${load.p99Ms} ms, failed starts ${failedStarts}, errors ${JSON.stringify(load.errors)}`,
    );
    return result;
  } finally {
    child.send({ type: 'stop' });
    await new Promise((resolve) => child.once('exit', resolve));
    await temporal.close();
    await stopTemporal?.();
  }
}
