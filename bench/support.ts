import { spawn } from 'node:child_process';
import { readdirSync, readFileSync, rmSync } from 'node:fs';
import path from 'node:path';
import { monitorEventLoopDelay } from 'node:perf_hooks';
import { fileURLToPath } from 'node:url';
import { type RawBuilder, sql } from 'kysely';
import pg from 'pg';
import { parseConfig } from '../core/config.ts';
import type { Db } from '../core/database.ts';
import type { ReservationLifecycle } from '../core/deps.ts';
import { createLogger, type Logger } from '../core/logger.ts';
import { BookingConflict, insertDeviceBookings } from '../db/allocations/bookings.ts';
import { startLocalPostgres } from '../db/local-postgres.ts';
import { migrateToLatest } from '../db/migrate.ts';
import { enqueueNodeCommand } from '../db/nodes/commands.ts';
import { insertPool, insertSite, offerPool } from '../db/nodes/fleet.ts';
import { createDb, type DbHandle, preparedMarker } from '../db/pool.ts';
import { bootstrapPlatform } from '../iam/bootstrap.ts';
import { createEmbeddedIam } from '../iam/embedded/index.ts';
import { createCompute } from '../server/compute.ts';
import { listen } from '../server/http.ts';
import { defaultToolsDir, startTemporalDevServer } from '../temporal/dev-server.ts';
import { type BenchTenant, type CreateShape, createReservationClient } from './create-client.ts';

/**
 * A fresh migrated database for one benchmark: on DATABASE_URL's server when set, else on a
 * private PostgreSQL started for the run (the same settings as the dev stack) and removed after.
 */
export async function benchDatabase(name: string, options: { max?: number } = {}) {
  const log = createLogger({ level: 'warn', name: 'bench' });
  let adminUrl = process.env.DATABASE_URL;
  let stopServer: (() => Promise<void>) | undefined;
  if (!adminUrl) {
    const server = await startLocalPostgres({
      dataDir: path.resolve('.data', `bench-postgres-${process.pid}`),
      database: 'postgres',
      log,
    });
    adminUrl = server.url;
    stopServer = async () => {
      await server.stop();
      rmSync(server.dataDir, { recursive: true, force: true });
    };
  }
  const database = `bc_bench_${name}_${process.pid}`;
  const admin = new pg.Client({ connectionString: adminUrl });
  await admin.connect();
  await admin.query(`CREATE DATABASE "${database}"`);
  const url = new URL(adminUrl);
  url.pathname = `/${database}`;
  const handle: DbHandle = createDb(url.toString(), { max: options.max ?? 32 });
  await migrateToLatest(handle.db);
  return {
    ...handle,
    url: url.toString(),
    async dispose() {
      await handle.close();
      await admin.query(`DROP DATABASE IF EXISTS "${database}" WITH (FORCE)`);
      await admin.end();
      await stopServer?.();
    },
  };
}

/**
 * The Temporal server for one benchmark: TEMPORAL_ADDRESS when set, else a private dev server
 * started for the run; `stop` stops that one and `pid` is its process (undefined and null when the
 * server is not ours).
 */
export async function benchTemporal(
  log: Logger,
): Promise<{ address: string; stop: (() => Promise<void>) | undefined; pid: number | null }> {
  const address = process.env.TEMPORAL_ADDRESS;
  if (address) return { address, stop: undefined, pid: null };
  const dataDir = path.resolve('.data', `bench-temporal-${process.pid}`);
  const server = await startTemporalDevServer({
    dataDir,
    toolsDir: defaultToolsDir(),
    log,
    headless: true,
    persist: false,
  });
  const stop = async () => {
    await server.stop();
    // Its log only: the server kept its workflows in memory.
    rmSync(dataDir, { recursive: true, force: true });
  };
  return { address: server.address, stop, pid: server.pid };
}

/** A benchmark site and its pool (`h100` on site `bench` unless named), owned by the platform. Answers their ids. */
export async function insertBenchPool(
  db: Db,
  input: { name?: string } = {},
): Promise<{ siteId: string; poolId: string }> {
  const name = input.name ?? 'h100';
  const siteId = await insertSite(db, {
    name: name === 'h100' ? 'bench' : `bench-${name}`,
    region: 'eu-central-1',
  });
  const poolId = await insertPool(db, {
    siteId,
    ownerTenantId: 'platform',
    name,
    gpuModel: 'h100',
  });
  return { siteId, poolId };
}

/** Percentile of an ascending-sorted sample. */
export function percentile(sorted: readonly number[], p: number): number {
  if (sorted.length === 0) return Number.NaN;
  return sorted[Math.min(sorted.length - 1, Math.floor((p / 100) * sorted.length))]!;
}

export interface LoadResult {
  committed: number;
  refused: number;
  errors: Record<string, number>;
  seconds: number;
  perSecond: number;
  p50Ms: number;
  p99Ms: number;
}

/**
 * Runs `workers` concurrent loops of `op` for `seconds` (bounded in time and count), timing each
 * call. `op` resolves to true when it committed, false when it was refused as expected.
 */
export async function runLoad(
  workers: number,
  seconds: number,
  op: (worker: number, i: number) => Promise<boolean>,
  maxOps = 2_000_000,
): Promise<LoadResult> {
  const latencies: number[] = [];
  const errors: Record<string, number> = {};
  let committed = 0;
  let refused = 0;
  let started = 0;
  const deadline = performance.now() + seconds * 1000;
  const t0 = performance.now();
  await Promise.all(
    Array.from({ length: workers }, async (_, worker) => {
      while (performance.now() < deadline && started < maxOps) {
        const i = started++;
        const begin = performance.now();
        try {
          if (await op(worker, i)) committed++;
          else refused++;
        } catch (error) {
          const code = (error as { code?: string }).code ?? (error as Error).name;
          errors[code] = (errors[code] ?? 0) + 1;
        }
        latencies.push(performance.now() - begin);
      }
    }),
  );
  const elapsed = (performance.now() - t0) / 1000;
  latencies.sort((a, b) => a - b);
  return {
    committed,
    refused,
    errors,
    seconds: Number(elapsed.toFixed(2)),
    perSecond: Math.round(committed / elapsed),
    p50Ms: Number(percentile(latencies, 50).toFixed(2)),
    p99Ms: Number(percentile(latencies, 99).toFixed(2)),
  };
}

/**
 * The statistics of a fleet in service before a measured part: `seconds` of its own load (not
 * counted), then ANALYZE, as autovacuum keeps a running fleet's tables analyzed. A benchmark's
 * booking tables start empty, and PostgreSQL plans a prepared statement over a table it last saw
 * empty as a sequential scan, kept on that connection until the next ANALYZE: without this, a
 * 15-s part measures scans of every booking it wrote itself (about 550 buffers a placement at
 * 10,000 nodes instead of about 170, bench/README.md).
 */
export async function warmUpStatistics(
  pool: pg.Pool,
  seconds: number,
  load: (seconds: number) => Promise<unknown>,
): Promise<void> {
  if (seconds <= 0) return;
  await load(seconds);
  await pool.query('ANALYZE');
}

/**
 * CPU seconds (user + system) so far of the PostgreSQL server's processes (postmaster, live
 * backends, and the backends that ended, which the postmaster's children's time counts), from /proc.
 */
export function postgresCpuSeconds(postmasterPid: number | null): number {
  if (!postmasterPid) return 0;
  const tick = 100;
  let total = 0;
  for (const pid of readdirSync('/proc').filter((p) => /^\d+$/.test(p))) {
    try {
      const fields = readFileSync(`/proc/${pid}/stat`, 'utf8').split(') ')[1]!.split(' ');
      if (Number(pid) === postmasterPid) {
        // Its own time and that of its children that ended (a backend whose connection closed).
        total += (Number(fields[11]) + Number(fields[12]) + Number(fields[13]) + Number(fields[14])) / tick;
      } else if (Number(fields[1]) === postmasterPid) {
        total += (Number(fields[11]) + Number(fields[12])) / tick;
      }
    } catch {
      // the process ended meanwhile
    }
  }
  return total;
}

/** CPU seconds (user + system) the process `pid` has used so far (0 once it ended). */
export function processCpuSeconds(pid: number): number {
  try {
    const fields = readFileSync(`/proc/${pid}/stat`, 'utf8').split(') ')[1]!.split(' ');
    return (Number(fields[11]) + Number(fields[12])) / 100;
  } catch {
    return 0;
  }
}

/** CPU seconds (user + system) this Node process has used so far. */
export function nodeCpuSeconds(): number {
  const { user, system } = process.cpuUsage();
  return (user + system) / 1e6;
}

/**
 * Starts counting this process's CPU (and that of the Node processes `alsoNodePids`, e.g. a placer
 * child's) and PostgreSQL's (`postgresCpuSeconds`); the answer, given how
 * many placements the span made, is the seconds each used and the CPU ms per placement (null for none).
 */
export function cpuMeter(postmasterPid: number | null, options: { alsoNodePids?: readonly number[] } = {}) {
  const others = options.alsoNodePids ?? [];
  const nodeNow = () => nodeCpuSeconds() + others.reduce((sum, pid) => sum + processCpuSeconds(pid), 0);
  const node0 = nodeNow();
  const postgres0 = postgresCpuSeconds(postmasterPid);
  return (placed: number) => {
    const nodeSeconds = nodeNow() - node0;
    const postgresSeconds = postgresCpuSeconds(postmasterPid) - postgres0;
    const msPerPlacement =
      placed === 0 ? null : Number((((nodeSeconds + postgresSeconds) * 1000) / placed).toFixed(2));
    return { nodeSeconds, postgresSeconds, msPerPlacement };
  };
}

/** The postmaster's pid of the server `pool` reaches (null when its data directory is not readable here). */
export async function postmasterPidOf(pool: pg.Pool): Promise<number | null> {
  const { rows } = await pool.query('SHOW data_directory');
  try {
    return Number(readFileSync(path.join(rows[0].data_directory, 'postmaster.pid'), 'utf8').split('\n')[0]);
  } catch {
    return null;
  }
}

/**
 * Booking attempts for `deviceIds` without placement around them: one reservation and `count`
 * planned allocations created up front (each attempt books for a fresh one; all on one node, so
 * they are stored as superseded: a reservation has one current allocation per node), and an unguarded copy
 * of `device_bookings` (no constraint, no locks) to compare with. `remove` deletes all of it.
 */
export async function prepareBookingLoad(
  db: Db,
  input: { poolId: string; nodeId: string; deviceIds: readonly string[]; count?: number },
) {
  const count = input.count ?? 400_000;
  await sql`
    INSERT INTO reservations (id, tenant_id, pool_id, owner_identity_id, idempotency_key, request, request_hash,
                              state, duration_ms)
    VALUES ('rsv_bench', 'tnt_bench', ${input.poolId}, 'idn_bench', 'bench', '{}', 'bench', 'placed', 3600000)`.execute(
    db,
  );
  await sql`
    INSERT INTO allocations (id, reservation_id, node_id, state, during, superseded_at)
    SELECT 'alloc_' || g, 'rsv_bench', ${input.nodeId}, 'planned', tstzrange(compute_now(), compute_now() + interval '1 hour'),
           compute_now()
    FROM generate_series(1, ${count}) AS g`.execute(db);
  await sql`CREATE TABLE device_bookings_unguarded (LIKE device_bookings INCLUDING DEFAULTS)`.execute(db);
  // The same table with its keys (the primary key and both foreign keys) but without the guard.
  await sql`
    CREATE TABLE device_bookings_keyed (
      LIKE device_bookings INCLUDING DEFAULTS,
      PRIMARY KEY (allocation_id, device_id),
      FOREIGN KEY (allocation_id) REFERENCES allocations (id) ON DELETE CASCADE,
      FOREIGN KEY (device_id) REFERENCES devices (id))`.execute(db);
  let next = 1;
  const allocation = () => `alloc_${next++}`;
  const devices = input.deviceIds;
  const hour = 3_600_000;
  const epoch = Date.UTC(2030, 0, 1);
  // Random device, random one-hour slot in a year: almost never a conflict.
  const slot = () => new Date(epoch + Math.floor(Math.random() * 8760) * hour);
  const device = () => devices[Math.floor(Math.random() * devices.length)]!;
  /** Inserts of one booking each into `table`, prepared as the guarded statement is. */
  const unguardedLoad = (table: RawBuilder<unknown>, workers: number, seconds: number) =>
    runLoad(workers, seconds, async () => {
      const start = slot();
      await db.transaction().execute((trx) =>
        sql`${sql.raw(preparedMarker)}
          INSERT INTO ${table} (device_id, allocation_id, during)
          VALUES (${device()}::text, ${allocation()}::text,
                  tstzrange(${start.toISOString()}::timestamptz, ${new Date(start.getTime() + hour).toISOString()}::timestamptz, '[)'))`.execute(
          trx,
        ),
      );
      return true;
    });
  return {
    allocation,
    /** Guarded bookings (per-device locks in order, the EXCLUDE constraint), no contention. */
    guarded: (workers: number, seconds: number) =>
      runLoad(workers, seconds, async () => {
        const start = slot();
        const booking = {
          deviceId: device(),
          allocationId: allocation(),
          start,
          end: new Date(start.getTime() + hour),
        };
        try {
          await db.transaction().execute((trx) => insertDeviceBookings(trx, [booking]));
          return true;
        } catch (error) {
          if (error instanceof BookingConflict) return false;
          throw error;
        }
      }),
    /** The same inserts into the bare copy: no constraint, no keys, no locks. */
    unguarded: (workers: number, seconds: number) =>
      unguardedLoad(sql`device_bookings_unguarded`, workers, seconds),
    /** The same inserts into the copy with the keys but without the guard (constraint and locks). */
    keyed: (workers: number, seconds: number) => unguardedLoad(sql`device_bookings_keyed`, workers, seconds),
    /** Deletes the bookings, allocations, reservation and table it made. */
    remove: async () => {
      await sql`DELETE FROM device_bookings WHERE allocation_id IN (SELECT id FROM allocations WHERE reservation_id = 'rsv_bench')`.execute(
        db,
      );
      await sql`DELETE FROM allocations WHERE reservation_id = 'rsv_bench'`.execute(db);
      await sql`DELETE FROM reservations WHERE id = 'rsv_bench'`.execute(db);
      await sql`DROP TABLE device_bookings_unguarded, device_bookings_keyed`.execute(db);
    },
  };
}

export type PlacerKind = 'inline' | 'pool-lease';

/** The pool's placer: pool-lease (batches of at most `batchSize`, default 64), or back to its own (inline). */
export function usePlacer(db: Db, poolId: string, placer: PlacerKind, options: { batchSize?: number } = {}) {
  const policy = { placer: 'pool-lease', poolLease: { batchSize: options.batchSize ?? 64 } };
  return (
    placer === 'pool-lease'
      ? sql`UPDATE pools SET policy = policy || ${JSON.stringify(policy)}::jsonb WHERE id = ${poolId}`
      : sql`UPDATE pools SET policy = policy - 'placer' - 'poolLease' WHERE id = ${poolId}`
  ).execute(db);
}

/** The pool-lease placer running in bench/placer-child.ts: its pid, its batches so far, and its stop. */
export interface PlacerChild {
  pid: number;
  batches(): Promise<number>;
  /** Stops the placer (its lease released) and the process; answers its batches. */
  stop(): Promise<number>;
}

/**
 * The pool-lease placer started in a process of its own (bench/placer-child.ts), as a worker runs
 * it beside the API in production; answers once it runs.
 */
export async function startPlacerInChild(input: {
  url: string;
  pollMs?: number;
  connections?: number;
}): Promise<PlacerChild> {
  const child = spawn(
    process.execPath,
    [
      // Profiled with this process (`node --cpu-prof --cpu-prof-dir D`): the placer's profile beside it.
      ...cpuProfileArgs(process.execArgv),
      '--import',
      'tsx',
      fileURLToPath(new URL('placer-child.ts', import.meta.url)),
      JSON.stringify({ url: input.url, pollMs: input.pollMs ?? 1_000, connections: input.connections ?? 8 }),
    ],
    { stdio: ['pipe', 'pipe', 'inherit'] },
  );
  const exited = new Promise<number | null>((resolve) => child.on('exit', resolve));
  const answers: Array<(line: Record<string, unknown>) => void> = [];
  let buffered = '';
  child.stdout.setEncoding('utf8');
  child.stdout.on('data', (chunk: string) => {
    buffered += chunk;
    for (let end = buffered.indexOf('\n'); end >= 0; end = buffered.indexOf('\n')) {
      const line = buffered.slice(0, end).trim();
      buffered = buffered.slice(end + 1);
      if (line.startsWith('{')) answers.shift()?.(JSON.parse(line) as Record<string, unknown>);
    }
  });
  const next = () =>
    Promise.race([
      new Promise<Record<string, unknown>>((resolve) => answers.push(resolve)),
      exited.then((code) => {
        throw new Error(`the placer child exited with ${code} before it answered`);
      }),
    ]);
  await next();
  return {
    pid: child.pid!,
    async batches() {
      const answer = next();
      child.stdin.write('batches\n');
      return Number((await answer).batches);
    },
    async stop() {
      const answer = next();
      child.stdin.end();
      const batches = Number((await answer).batches);
      await exited;
      return batches;
    },
  };
}

/**
 * The `--cpu-prof*` options among `execArgv`, with the values of those given as a separate
 * argument (`--cpu-prof-dir D`; a child given the option without its value exits with code 9).
 */
export function cpuProfileArgs(execArgv: readonly string[]): string[] {
  const kept: string[] = [];
  for (let i = 0; i < execArgv.length; i++) {
    const arg = execArgv[i]!;
    if (!arg.startsWith('--cpu-prof')) continue;
    kept.push(arg);
    if (arg !== '--cpu-prof' && !arg.includes('=') && i + 1 < execArgv.length) kept.push(execArgv[++i]!);
  }
  return kept;
}

/** bench/load-child.ts run to its end: its load's result and the CPU seconds it used. */
async function runLoadInChild(input: {
  url: string;
  poolId: string;
  tenants: readonly BenchTenant[];
  clients: number;
  seconds: number;
  shape: CreateShape;
}): Promise<LoadResult & { loadGeneratorCpuSeconds: number }> {
  const child = spawn(
    process.execPath,
    ['--import', 'tsx', fileURLToPath(new URL('load-child.ts', import.meta.url)), JSON.stringify(input)],
    { stdio: ['ignore', 'pipe', 'inherit'] },
  );
  let output = '';
  child.stdout.setEncoding('utf8');
  child.stdout.on('data', (chunk: string) => {
    output += chunk;
  });
  const code = await new Promise<number | null>((resolve) => child.on('exit', resolve));
  const last = output.trim().split('\n').at(-1) ?? '';
  if (code !== 0 || !last.startsWith('{')) {
    throw new Error(`the load generator exited with ${code}: ${output.slice(-500) || 'no output'}`);
  }
  const { result, cpuSeconds } = JSON.parse(last) as { result: LoadResult; cpuSeconds: number };
  return { ...result, loadGeneratorCpuSeconds: cpuSeconds };
}

/**
 * The HTTP API on a real port over `db`, with `tenants` tenants each offered `quotaGpus` of
 * `poolId` and holding one member token (rate limits off: the clients measure admission, not the
 * per-token limit), warmed up with one create per tenant. `place` creates one reservation of
 * `gpus` GPUs in one NVLink domain for `hours` (the whole admission path, a fresh idempotency key).
 */
export async function startPlacementApi(
  db: Db,
  input: {
    poolId: string;
    quotaGpus: number;
    log: Logger;
    tenants?: number;
    /** Tenant ids are `<prefix>-<i>` (default `tenant`): a second API in one database needs its own. */
    tenantPrefix?: string;
    /** Lifecycle starts after each commit (default none: admission does not wait on Temporal). */
    lifecycle?: ReservationLifecycle;
  },
) {
  const iam = createEmbeddedIam({ db, log: input.log });
  const { rootAdminToken } = await bootstrapPlatform(iam);
  const tenants: BenchTenant[] = [];
  for (let i = 0; i < (input.tenants ?? 10); i++) {
    const tenantId = `${input.tenantPrefix ?? 'tenant'}-${i}`;
    await iam.admin.createTenant({ id: tenantId, name: tenantId });
    const identity = await iam.admin.createIdentity({ tenantId, kind: 'service', name: 'loader' });
    await iam.admin.bindRole({ identityId: identity.id, role: 'member' });
    tenants.push({ tenantId, token: (await iam.admin.createToken({ identityId: identity.id })).token });
    await offerPool(db, { poolId: input.poolId, tenantId, quota: { gpu: input.quotaGpus } });
  }
  const config = parseConfig({
    BETTER_COMPUTE_RATE_LIMIT_PER_TOKEN: '0',
    BETTER_COMPUTE_RATE_LIMIT_PER_TENANT: '0',
  });
  const compute = createCompute({
    config,
    db,
    log: input.log,
    iam,
    ...(input.lifecycle ? { lifecycle: input.lifecycle } : {}),
  });
  const server = await listen(compute.app, '127.0.0.1', 0);
  const client = createReservationClient(server.url, {
    poolId: input.poolId,
    tenants,
    keyPrefix: 'bench-',
    sockets: Number.POSITIVE_INFINITY,
  });
  // Warm-up: authentication caches and the per-GPU share.
  const warmUpIds: string[] = [];
  for (const t of tenants) {
    const warm = await client.post(t.token, {
      tenantId: t.tenantId,
      poolId: input.poolId,
      devices: [{ class: 'gpu', count: 1 }],
      duration: '1h',
      idempotencyKey: `warm-${t.tenantId}`,
    });
    warmUpIds.push(warm.id);
  }
  return {
    rootAdminToken,
    /** The tenants' warm-up reservations (1 GPU for an hour, placed by admission), one per tenant. */
    warmUpIds,
    /**
     * One create by client `client`'s tenant: true when placed, false when left pending. With
     * `waitMs` the create waits for its operation (a pool-lease pool's batch).
     */
    place: client.place,
    /**
     * The closed-loop load of `runLoad` (`clients` clients for `seconds`, each create of `shape`)
     * from a process of its own (bench/load-child.ts), so this process's CPU is the control
     * plane's alone; with the CPU seconds the load generator used.
     */
    loadInChild: (clients: number, seconds: number, shape: CreateShape) =>
      runLoadInChild({ url: server.url, poolId: input.poolId, tenants, clients, seconds, shape }),
    stop: async () => {
      client.close();
      await server.stop();
    },
  };
}

export interface OpenLoopResult {
  ratePerSecond: number;
  issued: number;
  committed: number;
  refused: number;
  errors: Record<string, number>;
  /** Calls still unanswered when the wait after the run gave up. */
  unanswered: number;
  p50Ms: number;
  p99Ms: number;
  /**
   * This process's event-loop delay over the run (p99 and max, ms): the API answers from this
   * process, so a stall here delays every create in flight at once.
   */
  loopDelayP99Ms: number;
  loopDelayMaxMs: number;
  /** The one-second window (by scheduled time, from the start) whose creates had the highest p99. */
  worstSecond: { second: number; calls: number; p99Ms: number } | null;
  /** The p99 of each one-second window in order (a stall that recurs shows as a period here). */
  p99BySecond: number[];
}

/**
 * Open-loop load: `op` issued at `ratePerSecond` for `seconds`, each call on its schedule whether
 * or not earlier ones answered (not a closed loop, so a slow answer does not slow the arrivals).
 * Each latency runs from the call's scheduled time (a late timer counts against the system, no
 * coordinated omission). Waits for the answers at most `drainSeconds` after the last arrival.
 */
export async function runOpenLoop(
  ratePerSecond: number,
  seconds: number,
  op: (i: number) => Promise<boolean>,
  drainSeconds = 60,
): Promise<OpenLoopResult> {
  const latencies: number[] = [];
  const bySecond = new Map<number, number[]>();
  const errors: Record<string, number> = {};
  const loopDelay = monitorEventLoopDelay({ resolution: 10 });
  loopDelay.enable();
  let committed = 0;
  let refused = 0;
  const total = Math.max(1, Math.round(ratePerSecond * seconds));
  const interval = 1000 / ratePerSecond;
  const calls: Array<Promise<void>> = [];
  const t0 = performance.now();
  const answered = (scheduled: number) => {
    const latency = performance.now() - scheduled;
    latencies.push(latency);
    const second = Math.floor((scheduled - t0) / 1000);
    const window = bySecond.get(second);
    if (window) window.push(latency);
    else bySecond.set(second, [latency]);
  };
  let issued = 0;
  while (issued < total) {
    // Every arrival whose time has come, then sleep until the next one.
    const now = performance.now();
    while (issued < total && t0 + issued * interval <= now) {
      const scheduled = t0 + issued * interval;
      const i = issued++;
      calls.push(
        op(i).then(
          (placed) => {
            if (placed) committed++;
            else refused++;
            answered(scheduled);
          },
          (error: unknown) => {
            const code = (error as { code?: string }).code ?? (error as Error).name;
            errors[code] = (errors[code] ?? 0) + 1;
            answered(scheduled);
          },
        ),
      );
    }
    if (issued < total) {
      const wait = Math.max(0, t0 + issued * interval - performance.now());
      await new Promise((resolve) => setTimeout(resolve, wait));
    }
  }
  let timer: NodeJS.Timeout | undefined;
  await Promise.race([
    Promise.all(calls),
    new Promise((resolve) => {
      timer = setTimeout(resolve, drainSeconds * 1000);
    }),
  ]);
  clearTimeout(timer);
  loopDelay.disable();
  const sorted = [...latencies].sort((a, b) => a - b);
  let worstSecond: OpenLoopResult['worstSecond'] = null;
  const p99BySecond: number[] = [];
  for (const [second, values] of [...bySecond].sort(([a], [b]) => a - b)) {
    const p99Ms = Number(
      percentile(
        [...values].sort((a, b) => a - b),
        99,
      ).toFixed(2),
    );
    p99BySecond.push(Math.round(p99Ms));
    if (!worstSecond || p99Ms > worstSecond.p99Ms) worstSecond = { second, calls: values.length, p99Ms };
  }
  return {
    ratePerSecond: Number(ratePerSecond.toFixed(1)),
    issued,
    committed,
    refused,
    errors,
    unanswered: issued - latencies.length,
    p50Ms: Number(percentile(sorted, 50).toFixed(2)),
    p99Ms: Number(percentile(sorted, 99).toFixed(2)),
    loopDelayP99Ms: Number((loopDelay.percentile(99) / 1e6).toFixed(2)),
    loopDelayMaxMs: Number((loopDelay.max / 1e6).toFixed(2)),
    worstSecond,
    p99BySecond,
  };
}

/**
 * Ends every placed reservation in bulk at compute_now(), as far as placement can tell: its
 * current allocations `released` and their device and scalar bookings cut at compute_now(), so the
 * next part of a benchmark finds the pool as free as it was before the earlier parts placed there.
 * A benchmark shortcut, not a release: no lifecycle, event or refund (each part's tenants are its
 * own). With `tenantPrefix`, only the reservations of the tenants `<prefix>-<i>` (one API's, see
 * startPlacementApi); never those in `keep`. Answers how many reservations it ended.
 */
export async function endPlacedReservations(
  db: Db,
  input: { tenantPrefix?: string; keep?: readonly string[] } = {},
): Promise<number> {
  // The tenants asked for (all without a prefix), less the reservations to keep.
  const chosen = sql`${input.tenantPrefix ? sql`AND r.tenant_id LIKE ${`${input.tenantPrefix}-%`}` : sql``}
    AND r.id <> ALL(${[...(input.keep ?? [])]}::text[])`;
  return db.transaction().execute(async (trx) => {
    await sql`
      CREATE TEMP TABLE bench_ending ON COMMIT DROP AS
      SELECT a.id FROM allocations a JOIN reservations r ON r.id = a.reservation_id
      WHERE r.state = 'placed' ${chosen} AND a.superseded_at IS NULL
        AND a.state NOT IN ('released', 'failed')`.execute(trx);
    for (const table of [sql.raw('device_bookings'), sql.raw('scalar_bookings')]) {
      await sql`DELETE FROM ${table} WHERE allocation_id IN (SELECT id FROM bench_ending)
        AND lower(during) >= compute_now()`.execute(trx);
      await sql`UPDATE ${table} SET during = tstzrange(lower(during), compute_now(), '[)')
        WHERE allocation_id IN (SELECT id FROM bench_ending) AND upper(during) > compute_now()`.execute(trx);
    }
    await sql`UPDATE allocations SET state = 'released', updated_at = compute_now()
      WHERE id IN (SELECT id FROM bench_ending)`.execute(trx);
    const { rows } = await sql<{ n: number }>`
      WITH e AS (UPDATE reservations r SET state = 'released', end_reason = 'release', updated_at = compute_now()
                 WHERE r.state = 'placed' ${chosen} RETURNING 1)
      SELECT count(*)::int AS n FROM e`.execute(trx);
    return rows[0]!.n;
  });
}

/**
 * `count` live 1-GPU reservations written in bulk (generate_series), each a copy of a template
 * reservation that admission itself placed (a tenant's warm-up create), so every row is what the
 * system writes: the reservation (placed), its current allocation, its device booking, its scalar
 * bookings (the per-GPU host share), its quota charges, and the tenants' `quotas.used` raised by
 * what was charged. Reservation `g` (0-based) takes node `g % nodes`, and GPU `floor(g / nodes)`
 * of it (the nodes with nothing booked in the next two days, at most 8 per node: fewer are written
 * when those run out): the first `nodes` of them hold GPU 0 from now for a day; the rest hold GPUs 1, 2, … for
 * two hours at staggered starts between 9 and 22 hours ahead (inside the placer's read horizon,
 * the request window plus a day, and after the 8-hour windows the benchmark asks for, so every
 * node keeps 7 GPUs of one NVLink domain free for them). Answers how many were written, on how many nodes.
 */
export async function insertLiveReservations(
  db: Db,
  input: { poolId: string; templateIds: readonly string[]; count: number },
): Promise<{ written: number; nodes: number }> {
  return db.transaction().execute(async (trx) => {
    // The plan, on the transaction's connection: one row per live reservation with its template,
    // node, GPU and window, on the nodes with nothing booked in the next two days. The free nodes
    // and their GPUs are numbered in tables of their own, analyzed, so the plan joins them by
    // hash (in one statement the planner guessed one free node and nested 50,000 rows over all).
    await sql`
      CREATE TEMP TABLE bench_live_nodes ON COMMIT DROP AS
      SELECT n.id AS node_id, (row_number() OVER (ORDER BY n.name) - 1)::int AS i FROM nodes n
      WHERE n.pool_id = ${input.poolId} AND NOT EXISTS (
        SELECT 1 FROM devices d JOIN device_bookings b ON b.device_id = d.id
        WHERE d.node_id = n.id AND b.during && tstzrange(compute_now(), compute_now() + interval '2 days'))`.execute(
      trx,
    );
    await sql`
      CREATE TEMP TABLE bench_live_devices ON COMMIT DROP AS
      SELECT d.node_id, d.id AS device_id, (row_number() OVER (PARTITION BY d.node_id ORDER BY d.id) - 1)::int AS j
      FROM devices d JOIN bench_live_nodes n USING (node_id) WHERE d.class = 'gpu' AND d.removed_at IS NULL`.execute(
      trx,
    );
    await sql`ANALYZE bench_live_nodes`.execute(trx);
    await sql`ANALYZE bench_live_devices`.execute(trx);
    await sql`
      CREATE TEMP TABLE bench_live ON COMMIT DROP AS
      WITH t AS (
        SELECT r.id, r.tenant_id, (x.k - 1)::int AS k
        FROM unnest(${input.templateIds as string[]}::text[]) WITH ORDINALITY AS x(id, k) JOIN reservations r USING (id)),
      c AS (SELECT count(*)::int AS nodes FROM bench_live_nodes),
      p AS (SELECT g, g % c.nodes AS i, g / c.nodes AS j, c.nodes
            FROM generate_series(0, ${input.count - 1}) AS g CROSS JOIN c WHERE c.nodes > 0)
      SELECT p.g, 'rsv_live' || p.g AS id, 'alloc_live' || p.g AS allocation_id, t.id AS template_id, t.tenant_id,
             n.node_id, d.device_id,
             CASE WHEN p.j = 0
               THEN tstzrange(compute_now(), compute_now() + interval '1 day', '[)')
               ELSE tstzrange(compute_now() + interval '9 hours' + ((p.g % 12) * interval '1 hour'),
                              compute_now() + interval '11 hours' + ((p.g % 12) * interval '1 hour'), '[)') END AS during
      FROM p
      JOIN t ON t.k = p.g % ${input.templateIds.length}
      JOIN bench_live_nodes n ON n.i = p.i
      JOIN bench_live_devices d ON d.node_id = n.node_id AND d.j = p.j`.execute(trx);
    await sql`ANALYZE bench_live`.execute(trx);
    await sql`
      INSERT INTO reservations
      SELECT (jsonb_populate_record(NULL::reservations, to_jsonb(r) || jsonb_build_object(
               'id', b.id, 'idempotency_key', 'live-' || b.g, 'during', b.during,
               'requested_start', lower(b.during), 'lifecycle_started_at', compute_now()))).*
      FROM bench_live b JOIN reservations r ON r.id = b.template_id`.execute(trx);
    await sql`
      INSERT INTO allocations
      SELECT (jsonb_populate_record(NULL::allocations, to_jsonb(a) || jsonb_build_object(
               'id', b.allocation_id, 'reservation_id', b.id, 'node_id', b.node_id, 'during', b.during))).*
      FROM bench_live b JOIN allocations a ON a.reservation_id = b.template_id AND a.superseded_at IS NULL`.execute(
      trx,
    );
    await sql`
      INSERT INTO device_bookings (device_id, allocation_id, during)
      SELECT device_id, allocation_id, during FROM bench_live`.execute(trx);
    await sql`
      INSERT INTO scalar_bookings
      SELECT (jsonb_populate_record(NULL::scalar_bookings, to_jsonb(s) || jsonb_build_object(
               'allocation_id', b.allocation_id, 'node_id', b.node_id, 'during', b.during))).*
      FROM bench_live b JOIN allocations a ON a.reservation_id = b.template_id AND a.superseded_at IS NULL
      JOIN scalar_bookings s ON s.allocation_id = a.id`.execute(trx);
    await sql`
      INSERT INTO quota_charges
      SELECT (jsonb_populate_record(NULL::quota_charges, to_jsonb(q) || jsonb_build_object('reservation_id', b.id))).*
      FROM bench_live b JOIN quota_charges q ON q.reservation_id = b.template_id AND q.refunded_at IS NULL`.execute(
      trx,
    );
    await sql`
      UPDATE quotas SET used = used + c.amount
      FROM (SELECT q.tenant_id, q.pool_id, q.resource, sum(q.amount) AS amount
            FROM bench_live b JOIN quota_charges q ON q.reservation_id = b.id GROUP BY 1, 2, 3) c
      WHERE quotas.tenant_id = c.tenant_id AND quotas.pool_id = c.pool_id AND quotas.resource = c.resource`.execute(
      trx,
    );
    const { rows } = await sql<{ written: number; nodes: number }>`
      SELECT count(*)::int AS written, count(DISTINCT node_id)::int AS nodes FROM bench_live`.execute(trx);
    return rows[0]!;
  });
}

/** One command of `probeCommands`: its node, when it was enqueued (wall time) and its latency. */
export interface CommandProbe {
  id: string;
  nodeId: string;
  atMs: number;
  /** Enqueue commit → result stored; null when it did not complete in time. */
  ms: number | null;
}

/**
 * `diag.nvml` (a quick check whose result is small, so the probe does not measure an inventory
 * write) enqueued to random nodes of `nodeIds` at `rate` a second, `count` of them or while
 * `go()` holds for `seconds`. Each is stamped (wall time, to compare with a gateway process's
 * stamps) after its enqueue transaction commits; `completedAt` is filled by the caller from the
 * gateway's completion callback. Waits up to `stragglerMs` for the last ones.
 */
export async function probeCommands(
  db: Db,
  input: {
    nodeIds: readonly string[];
    rate: number;
    count?: number;
    seconds?: number;
    go?: () => boolean;
    completedAt: ReadonlyMap<string, number>;
    stragglerMs?: number;
  },
): Promise<CommandProbe[]> {
  const sent: Array<{ id: string; nodeId: string; atMs: number }> = [];
  const interval = 1000 / input.rate;
  const start = performance.now();
  const more = (i: number) =>
    (input.count === undefined || i < input.count) &&
    (input.seconds === undefined || performance.now() - start < input.seconds * 1000) &&
    (input.go?.() ?? true);
  for (let i = 0; more(i); i++) {
    const wait = start + i * interval - performance.now();
    if (wait > 0) await new Promise((r) => setTimeout(r, wait));
    const nodeId = input.nodeIds[Math.floor(Math.random() * input.nodeIds.length)]!;
    const { id } = await db.transaction().execute((trx) =>
      enqueueNodeCommand(trx, {
        nodeId,
        kind: 'diag.nvml',
        payload: { level: 'quick' },
        notAfterSeconds: 300,
      }),
    );
    // wall time: compared with the gateway process's completion stamps
    sent.push({ id, nodeId, atMs: Date.now() });
  }
  const deadline = performance.now() + (input.stragglerMs ?? 60_000);
  while (sent.some(({ id }) => !input.completedAt.has(id)) && performance.now() < deadline) {
    await new Promise((r) => setTimeout(r, 100));
  }
  return sent.map(({ id, nodeId, atMs }) => {
    const done = input.completedAt.get(id);
    return { id, nodeId, atMs, ms: done === undefined ? null : done - atMs };
  });
}

/**
 * The lifecycles of a bench that runs no Temporal: reservation lifecycles are not what it
 * measures (inline creates start none either), so the pool placer's wake-ups after each batch go
 * nowhere.
 */
export const noLifecycle: ReservationLifecycle = {
  start: async () => {},
  running: async () => new Set<string>(),
  signal: async () => {},
  wakePool: async () => {},
};
