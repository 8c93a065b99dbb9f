import { readdirSync, readFileSync, rmSync } from 'node:fs';
import path from 'node:path';
import { sql } from 'kysely';
import pg from 'pg';
import { parseConfig } from '../core/config.ts';
import type { Db } from '../core/database.ts';
import { createLogger, type Logger } from '../core/logger.ts';
import { BookingConflict, insertDeviceBookings } from '../db/allocations/bookings.ts';
import { startLocalPostgres } from '../db/local-postgres.ts';
import { migrateToLatest } from '../db/migrate.ts';
import { enqueueNodeCommand } from '../db/nodes/commands.ts';
import { insertPool, insertSite, offerPool } from '../db/nodes/fleet.ts';
import { createDb, type DbHandle } from '../db/pool.ts';
import { bootstrapPlatform } from '../iam/bootstrap.ts';
import { createEmbeddedIam } from '../iam/embedded/index.ts';
import { createCompute } from '../server/compute.ts';
import { listen } from '../server/http.ts';
import { defaultToolsDir, startTemporalDevServer } from '../temporal/dev-server.ts';

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
 * started for the run; `stop` stops that one (undefined when the server is not ours).
 */
export async function benchTemporal(
  log: Logger,
): Promise<{ address: string; stop: (() => Promise<void>) | undefined }> {
  const address = process.env.TEMPORAL_ADDRESS;
  if (address) return { address, stop: undefined };
  const server = await startTemporalDevServer({
    dataDir: path.resolve('.data', `bench-temporal-${process.pid}`),
    toolsDir: defaultToolsDir(),
    log,
    headless: true,
    persist: false,
  });
  return { address: server.address, stop: server.stop };
}

/** The benchmark's site and its `h100` pool, owned by the platform. Answers their ids. */
export async function insertBenchPool(db: Db): Promise<{ siteId: string; poolId: string }> {
  const siteId = await insertSite(db, { name: 'bench', region: 'eu-central-1' });
  const poolId = await insertPool(db, {
    siteId,
    ownerTenantId: 'platform',
    name: 'h100',
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

/** CPU seconds (user + system) so far of the PostgreSQL server's processes (postmaster and backends), from /proc. */
export function postgresCpuSeconds(postmasterPid: number | null): number {
  if (!postmasterPid) return 0;
  const tick = 100;
  let total = 0;
  for (const pid of readdirSync('/proc').filter((p) => /^\d+$/.test(p))) {
    try {
      const fields = readFileSync(`/proc/${pid}/stat`, 'utf8').split(') ')[1]!.split(' ');
      if (Number(pid) === postmasterPid || Number(fields[1]) === postmasterPid) {
        total += (Number(fields[11]) + Number(fields[12])) / tick;
      }
    } catch {
      // the process ended meanwhile
    }
  }
  return total;
}

/** CPU seconds (user + system) this Node process has used so far. */
export function nodeCpuSeconds(): number {
  const { user, system } = process.cpuUsage();
  return (user + system) / 1e6;
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
  let next = 1;
  const allocation = () => `alloc_${next++}`;
  const devices = input.deviceIds;
  const hour = 3_600_000;
  const epoch = Date.UTC(2030, 0, 1);
  // Random device, random one-hour slot in a year: almost never a conflict.
  const slot = () => new Date(epoch + Math.floor(Math.random() * 8760) * hour);
  const device = () => devices[Math.floor(Math.random() * devices.length)]!;
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
    /** The same inserts into the copy without the constraint and without locks. */
    unguarded: (workers: number, seconds: number) =>
      runLoad(workers, seconds, async () => {
        const start = slot();
        await db.transaction().execute((trx) =>
          sql`INSERT INTO device_bookings_unguarded (device_id, allocation_id, during)
              VALUES (${device()}, ${allocation()}, tstzrange(${start}, ${new Date(start.getTime() + hour)}, '[)'))`.execute(
            trx,
          ),
        );
        return true;
      }),
    /** Deletes the bookings, allocations, reservation and table it made. */
    remove: async () => {
      await sql`DELETE FROM device_bookings WHERE allocation_id IN (SELECT id FROM allocations WHERE reservation_id = 'rsv_bench')`.execute(
        db,
      );
      await sql`DELETE FROM allocations WHERE reservation_id = 'rsv_bench'`.execute(db);
      await sql`DELETE FROM reservations WHERE id = 'rsv_bench'`.execute(db);
      await sql`DROP TABLE device_bookings_unguarded`.execute(db);
    },
  };
}

/**
 * The HTTP API on a real port over `db`, with `tenants` tenants each offered `quotaGpus` of
 * `poolId` and holding one member token (rate limits off: the clients measure admission, not the
 * per-token limit), warmed up with one create per tenant. `place` creates one reservation of
 * `gpus` GPUs in one NVLink domain for `hours` (the whole admission path, a fresh idempotency key).
 */
export async function startPlacementApi(
  db: Db,
  input: { poolId: string; quotaGpus: number; log: Logger; tenants?: number },
) {
  const iam = createEmbeddedIam({ db, log: input.log });
  const { rootAdminToken } = await bootstrapPlatform(iam);
  const tokens: Array<{ tenantId: string; token: string }> = [];
  for (let i = 0; i < (input.tenants ?? 10); i++) {
    const tenantId = `tenant-${i}`;
    await iam.admin.createTenant({ id: tenantId, name: tenantId });
    const identity = await iam.admin.createIdentity({ tenantId, kind: 'service', name: 'loader' });
    await iam.admin.bindRole({ identityId: identity.id, role: 'member' });
    tokens.push({ tenantId, token: (await iam.admin.createToken({ identityId: identity.id })).token });
    await offerPool(db, { poolId: input.poolId, tenantId, quota: { gpu: input.quotaGpus } });
  }
  const config = parseConfig({
    BETTER_COMPUTE_RATE_LIMIT_PER_TOKEN: '0',
    BETTER_COMPUTE_RATE_LIMIT_PER_TENANT: '0',
  });
  const compute = createCompute({ config, db, log: input.log, iam });
  const server = await listen(compute.app, '127.0.0.1', 0);
  const post = async (token: string, body: unknown) => {
    const response = await fetch(`${server.url}/api/compute/reservations/create`, {
      method: 'POST',
      headers: {
        authorization: `Bearer ${token}`,
        'content-type': 'application/json',
        'x-better-compute': '1',
      },
      body: JSON.stringify(body),
    });
    const json = (await response.json()) as {
      data?: { state: string };
      error?: { code: string; message: string };
    };
    if (json.error) throw Object.assign(new Error(json.error.message), { code: json.error.code });
    return json.data!;
  };
  // Warm-up: authentication caches and the per-GPU share.
  for (const t of tokens) {
    await post(t.token, {
      tenantId: t.tenantId,
      poolId: input.poolId,
      devices: [{ class: 'gpu', count: 1 }],
      duration: '1h',
      idempotencyKey: `warm-${t.tenantId}`,
    });
  }
  let key = 0;
  return {
    rootAdminToken,
    /** One create by client `client`'s tenant: true when placed, false when left pending. */
    place: async (client: number, shape: { gpus: number; duration: string }) => {
      const t = tokens[client % tokens.length]!;
      const r = await post(t.token, {
        tenantId: t.tenantId,
        poolId: input.poolId,
        devices: [{ class: 'gpu', count: shape.gpus, topology: 'nvlink-all' }],
        duration: shape.duration,
        idempotencyKey: `bench-${key++}`,
      });
      return r.state === 'placed';
    },
    stop: () => server.stop(),
  };
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
