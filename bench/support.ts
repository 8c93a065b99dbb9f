import { rmSync } from 'node:fs';
import path from 'node:path';
import pg from 'pg';
import { createLogger } from '../core/logger.ts';
import { startLocalPostgres } from '../db/local-postgres.ts';
import { migrateToLatest } from '../db/migrate.ts';
import { createDb, type DbHandle } from '../db/pool.ts';

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
