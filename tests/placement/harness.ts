import { parseConfig } from '../../core/config.ts';
import type { Db } from '../../core/database.ts';
import type { Logger } from '../../core/logger.ts';
import type { NodeShape } from '../../db/nodes/fleet.ts';
import { bootstrapPlatform } from '../../iam/bootstrap.ts';
import { createEmbeddedIam, type EmbeddedIam } from '../../iam/embedded/index.ts';
import { type Compute, createCompute } from '../../server/compute.ts';
import type { PoolPlacerOptions } from '../../temporal/pool-placer.ts';
import { type ApiAnswer, callApi } from '../support/api.ts';
import { createTestDatabase, type TestDatabase } from '../support/database.ts';
import { type SeededPool, seedPool, smallShape } from '../support/fleet.ts';
import { useFixture } from '../support/hooks.ts';
import { type TenantMember, tenantMember } from '../support/iam.ts';
import { testLogger } from '../support/logger.ts';
import { startTestTemporal, type TestTemporal } from '../support/temporal.ts';

/** The pool-lease placer's world: a pool-lease pool of small nodes offered to two tenants. */
export interface PoolLeaseHarness {
  t: TestDatabase;
  db: Db;
  log: Logger;
  iam: EmbeddedIam;
  temporal: TestTemporal;
  compute: Compute;
  pool: SeededPool;
  acme: TenantMember;
  globex: TenantMember;
  /** The platform's root administrator's token. */
  rootToken: string;
  call(token: string, path: string, body: unknown): Promise<ApiAnswer>;
  /** Creates a reservation of `gpus` GPUs for 2 h in the harness's pool. */
  create(who: TenantMember, key: string, extra?: Record<string, unknown>): Promise<ApiAnswer>;
  stop(): Promise<void>;
}

export interface PoolLeaseHarnessOptions {
  name: string;
  nodes: number;
  batchSize?: number;
  /** The nodes' shape (default smallShape: two H100s, no host resources). */
  shape?: NodeShape;
  /** Start the in-process worker (and its pool placer) at once (default true). */
  worker?: boolean;
  poolPlacer?: PoolPlacerOptions;
}

export async function startPoolLeaseHarness(options: PoolLeaseHarnessOptions): Promise<PoolLeaseHarness> {
  const log = testLogger(`test-${options.name}`, process.env.LOG_LEVEL ?? 'warn');
  const t = await createTestDatabase();
  try {
    const iam = createEmbeddedIam({ db: t.db, log });
    const platform = await bootstrapPlatform(iam);
    const acme = await tenantMember(iam, 'acme');
    const globex = await tenantMember(iam, 'globex');
    const pool = await seedPool(t.db, {
      site: `site-${options.name}`,
      nodes: options.nodes,
      shape: options.shape ?? smallShape,
      policy: {
        placer: 'pool-lease',
        ...(options.batchSize ? { poolLease: { batchSize: options.batchSize } } : {}),
      },
      offers: { acme: { gpu: 1_000 }, globex: { gpu: 1_000 } },
    });
    const temporal = await startTestTemporal({
      name: options.name,
      db: t.db,
      log,
      iam,
      timers: { bindTimeoutMs: 60_000, pendingRetryMs: 1_000, maxPendingMs: 120_000, recheckMs: 30_000 },
      ...(options.worker === false ? { worker: false } : {}),
      ...(options.poolPlacer ? { poolPlacer: options.poolPlacer } : {}),
    });
    const compute = createCompute({
      config: parseConfig({
        BETTER_COMPUTE_RATE_LIMIT_PER_TOKEN: '0',
        BETTER_COMPUTE_RATE_LIMIT_PER_TENANT: '0',
      }),
      db: t.db,
      log,
      iam,
      lifecycle: temporal.lifecycle,
      temporal: temporal.client,
    });
    const call = (token: string, path: string, body: unknown) => callApi(compute.app, token, path, body);
    return {
      t,
      db: t.db,
      log,
      iam,
      temporal,
      compute,
      pool,
      acme,
      globex,
      rootToken: platform.rootAdminToken,
      call,
      create: (who, key, extra = {}) =>
        call(who.token, 'reservations/create', {
          tenantId: who.tenantId,
          poolId: pool.poolId,
          devices: [{ class: 'gpu', count: 1 }],
          duration: '2h',
          idempotencyKey: key,
          ...extra,
        }),
      async stop() {
        await temporal.stop();
        await t.drop();
      },
    };
  } catch (error) {
    await t.drop();
    throw error;
  }
}

export function usePoolLeaseHarness(options: PoolLeaseHarnessOptions): PoolLeaseHarness {
  return useFixture(
    () => startPoolLeaseHarness(options),
    (h) => h.stop(),
  );
}
