import { Client, Connection } from '@temporalio/client';
import type pg from 'pg';
import { z } from 'zod';
import { type Config, configSchema, type ProcessMode, processModes } from '../core/config.ts';
import type { Deps } from '../core/deps.ts';
import { createLogger, type Logger } from '../core/logger.ts';
import { migrateToLatest } from '../db/migrate.ts';
import { createDb, type DbHandle, useExistingPool } from '../db/pool.ts';
import { bootstrapPlatform } from '../iam/bootstrap.ts';
import { createEmbeddedIam, type EmbeddedIam } from '../iam/embedded/index.ts';
import { createTemporalLifecycle } from '../temporal/lifecycle.ts';
import { type Compute, createCompute } from './compute.ts';
import { startModeProcesses } from './serve.ts';

/** The options of `betterCompute()`. Nothing here is read from `process.env`: pass what you configure. */
export interface BetterComputeOptions {
  /**
   * The PostgreSQL database that holds compute's truth: a `postgres://` URL, `{ url, max }` (max
   * connections, default 20), or a `pg.Pool` you own (`stop()` leaves it open).
   */
  database: string | { url: string; max?: number } | pg.Pool;
  /**
   * The Temporal cluster the lifecycles run on. Without it `api` and `handler` still admit and
   * place reservations, and `start()` runs no worker: each lifecycle starts once a worker with
   * Temporal runs (its orphan sweeper finds every reservation left without one).
   */
  temporal?: {
    /** The frontend, e.g. `127.0.0.1:7233`. */
    address: string;
    /** Default `default`. */
    namespace?: string;
    /** Default `better-compute`. */
    taskQueue?: string;
    /**
     * The orphan-sweeper Schedule the worker keeps (default: every 60 s, one per namespace);
     * `false` leaves it alone, for deployments that run it from another worker.
     */
    sweeper?: false | { everyMs?: number; scheduleId?: string };
  };
  /**
   * Which parts `start()` runs (default `all`): `api` delivers webhooks (you serve `handler`
   * yourself), `worker` runs the Temporal worker, `gateway` the bcd gateway (only when `gateway`
   * is configured below).
   */
  mode?: ProcessMode;
  /** The gRPC gateway bcd daemons dial (mutual TLS); `start()` runs it only when this is given. */
  gateway?: { host?: string; port?: number; trustDomain?: string };
  /**
   * The deployment secret, at least 32 characters (`BETTER_COMPUTE_SECRET` of `better-compute
   * serve`; e.g. `openssl rand -base64 48`), the same in every process of a deployment. Webhook
   * signing secrets and the CA's private key are sealed at rest with it. Without it `start()`
   * refuses a mode that uses them (`api`, `gateway`, `all`), and `webhooks.create` and a first
   * `joinTokens.create` answer UNSUPPORTED.
   */
  secret?: string;
  /** The root (platform) tenant `initialize()` creates when there is none (default `platform`). */
  rootTenantId?: string;
  /** A pino logger to log through (a child of it); without it, JSON lines on stdout. */
  logger?: Logger;
  /** Default `info` (or the given logger's own level). */
  logLevel?: 'fatal' | 'error' | 'warn' | 'info' | 'debug' | 'trace' | 'silent';
}

/** What `initialize()` answers. */
export interface InitializeResult {
  /** The migrations this call applied (empty when the database was up to date). */
  migrationsApplied: string[];
  rootTenantId: string;
  rootAdminIdentityId: string;
  /**
   * A fresh API token of the root tenant's `platform-admin` identity (every `compute:*` action).
   * Each call mints a new one; tokens are stored hashed, so an earlier one is never handed back.
   */
  rootAdminToken: string;
}

export interface BetterCompute {
  /** `compute.api.{group}.{method}(credential, input)`: every API method, in process. */
  api: Compute['api'];
  /**
   * The HTTP API as a fetch handler (`POST /api/compute/{group}/{method}`, the OpenAPI document,
   * the event stream), mountable in any server that speaks `Request`/`Response`.
   */
  handler: (request: Request) => Promise<Response>;
  /** The method registry (what `createComputeClient<typeof compute>` infers its types from). */
  methods: Compute['methods'];
  /** The embedded IAM and its administration (tenants, identities, tokens, roles, policies). */
  iam: EmbeddedIam;
  /**
   * Migrates the database to the newest schema (all or nothing) and makes sure the platform
   * exists: the root tenant and its admin identity, with a fresh token. Call it before serving.
   */
  initialize(): Promise<InitializeResult>;
  /**
   * Starts what `mode` runs besides the API: the webhook dispatcher, the Temporal worker (with
   * `temporal`) and the gateway (with `gateway`). A second call changes nothing. Whatever started
   * is stopped again if a later part fails.
   */
  start(): Promise<{ gateway: { address: string; caCertificatePem: string } | null }>;
  /** Stops what `start()` started and closes the Temporal connection and the database (unless you own the pool). */
  stop(): Promise<void>;
}

const logLevels = ['fatal', 'error', 'warn', 'info', 'debug', 'trace', 'silent'] as const;

const postgresUrl = z
  .string()
  .refine(
    (value) => /^postgres(ql)?:\/\//.test(value) && URL.canParse(value),
    'expected a postgres:// or postgresql:// URL',
  );

const poolLike = z.custom<pg.Pool>(
  (value) =>
    typeof value === 'object' &&
    value !== null &&
    typeof (value as pg.Pool).connect === 'function' &&
    typeof (value as pg.Pool).query === 'function' &&
    typeof (value as pg.Pool).on === 'function',
);

const loggerLike = z.custom<Logger>(
  (value) =>
    typeof value === 'object' &&
    value !== null &&
    ['child', 'info', 'warn', 'error', 'debug'].every(
      (name) => typeof (value as Record<string, unknown>)[name] === 'function',
    ),
  'a pino logger (child, debug, info, warn, error)',
);

const optionsSchema = z.strictObject({
  database: z.union(
    [
      postgresUrl,
      z.strictObject({ url: postgresUrl, max: z.number().int().min(1).max(500).optional() }),
      poolLike,
    ],
    { error: 'expected a postgres:// URL, { url, max? } or a pg.Pool' },
  ),
  temporal: z
    .strictObject({
      address: z.string().min(1),
      namespace: z.string().min(1).optional(),
      taskQueue: z.string().min(1).optional(),
      sweeper: z
        .union([
          z.literal(false),
          z.strictObject({
            everyMs: z.number().int().min(1_000).optional(),
            scheduleId: z.string().min(1).optional(),
          }),
        ])
        .optional(),
    })
    .optional(),
  mode: z.enum(processModes).default('all'),
  gateway: z
    .strictObject({
      host: z.string().min(1).optional(),
      port: z.number().int().min(0).max(65535).optional(),
      trustDomain: z.string().min(1).optional(),
    })
    .optional(),
  secret: z.string().min(32, 'at least 32 characters').optional(),
  rootTenantId: z.string().min(1).optional(),
  logger: loggerLike.optional(),
  logLevel: z.enum(logLevels).optional(),
});

type ParsedOptions = z.output<typeof optionsSchema>;

// Options of the specification's betterCompute() that this build does not take, with why.
const unsupported: Record<string, string> = {
  iam: 'betterCompute embeds its own IAM (see the `iam` it returns); an external IamPort is not supported yet',
  modules: 'no modules (metal, vps, …) exist yet',
  baseURL: 'nothing here builds absolute links yet; serve `handler` at the URL you choose',
};

/** Parses the options once; a bad one throws an Error naming it. */
function parseOptions(input: BetterComputeOptions): ParsedOptions {
  if (typeof input !== 'object' || input === null) {
    throw new Error('betterCompute: options must be an object with at least `database`');
  }
  for (const [name, why] of Object.entries(unsupported)) {
    if (name in input) throw new Error(`betterCompute: option ${name} is not supported: ${why}`);
  }
  // `satisfies`: the documented interface and the schema cannot drift apart.
  const result = optionsSchema.safeParse(input satisfies z.input<typeof optionsSchema>);
  if (result.success) return result.data;
  const issue = result.error.issues[0]!;
  if (issue.code === 'unrecognized_keys') {
    const names = issue.keys.map((key) => [...issue.path, key].join('.'));
    throw new Error(`betterCompute: unknown option ${names.join(', ')}`);
  }
  throw new Error(`betterCompute: option ${issue.path.join('.')} is invalid: ${issue.message}`);
}

/** The one configuration of the process, from the options (defaults as `better-compute serve` has them). */
function configOf(options: ParsedOptions): Config {
  return configSchema.parse({
    TEMPORAL_ADDRESS: options.temporal?.address,
    TEMPORAL_NAMESPACE: options.temporal?.namespace,
    BETTER_COMPUTE_TASK_QUEUE: options.temporal?.taskQueue,
    BETTER_COMPUTE_GATEWAY_HOST: options.gateway?.host,
    BETTER_COMPUTE_GATEWAY_PORT: options.gateway?.port,
    BETTER_COMPUTE_TRUST_DOMAIN: options.gateway?.trustDomain,
    LOG_LEVEL: options.logLevel,
    BETTER_COMPUTE_SECRET: options.secret,
  });
}

function openDatabase(database: ParsedOptions['database'], config: Config): DbHandle {
  if (typeof database === 'string') return createDb(database, { max: config.BETTER_COMPUTE_DB_POOL_MAX });
  if ('url' in database && typeof database.url === 'string') {
    return createDb(database.url, { max: database.max ?? config.BETTER_COMPUTE_DB_POOL_MAX });
  }
  return useExistingPool(database as pg.Pool);
}

function loggerOf(options: ParsedOptions): Logger {
  if (!options.logger) return createLogger({ level: options.logLevel ?? 'info' });
  return options.logLevel ? options.logger.child({}, { level: options.logLevel }) : options.logger.child({});
}

/**
 * The embeddable control plane, as the specification's introduction shows it:
 *
 * ```ts
 * const compute = betterCompute({ database: process.env.DATABASE_URL!, temporal: { address } });
 * const { rootAdminToken } = await compute.initialize();
 * await compute.start();
 * serve({ fetch: compute.handler }); // @hono/node-server, Bun.serve, Deno.serve, a Next.js route…
 * await compute.api.reservations.create({ token }, { tenantId, poolId, devices, duration, idempotencyKey });
 * ```
 *
 * Building it opens nothing: the database pool and the Temporal connection connect on first use.
 */
export function betterCompute(input: BetterComputeOptions): BetterCompute {
  const options = parseOptions(input);
  const config = configOf(options);
  const log = loggerOf(options);
  const database = openDatabase(options.database, config);
  const iam = createEmbeddedIam({ db: database.db, log: log.child({ component: 'iam' }) });
  // Lazy, so building the control plane stays synchronous; a Temporal that is down fails only the
  // lifecycle calls after admission's commit, which the sweeper catches up on.
  const connection = options.temporal ? Connection.lazy({ address: options.temporal.address }) : null;
  const temporal = connection ? new Client({ connection, namespace: config.TEMPORAL_NAMESPACE }) : undefined;
  const deps: Deps = {
    config,
    db: database.db,
    log,
    iam,
    ...(temporal
      ? {
          temporal,
          lifecycle: createTemporalLifecycle(temporal, { taskQueue: config.BETTER_COMPUTE_TASK_QUEUE }),
        }
      : {}),
  };
  const compute = createCompute(deps);

  const stops: Array<() => Promise<void>> = [];
  const stopAll = async () => {
    for (const stop of stops.splice(0).reverse())
      await stop().catch((err) => log.warn({ err }, 'error while stopping'));
  };
  let started: ReturnType<BetterCompute['start']> | null = null;
  let stopped: Promise<void> | null = null;

  return {
    api: compute.api,
    handler: async (request) => compute.app.fetch(request),
    methods: compute.methods,
    iam,
    async initialize() {
      const { applied } = await migrateToLatest(database.db);
      if (applied.length) log.info({ applied }, 'migrations applied');
      const boot = await bootstrapPlatform(iam, {
        tokenName: 'embed',
        ...(options.rootTenantId ? { rootTenantId: options.rootTenantId } : {}),
      });
      return { migrationsApplied: applied, ...boot };
    },
    start() {
      if (stopped) return Promise.reject(new Error('betterCompute: start() after stop()'));
      started ??= startModeProcesses(
        {
          mode: options.mode,
          deps,
          ...(options.temporal
            ? {
                temporal: {
                  address: options.temporal.address,
                  ...(options.temporal.sweeper !== undefined ? { sweeper: options.temporal.sweeper } : {}),
                },
              }
            : {}),
          gateway: options.gateway !== undefined,
        },
        stops,
      ).then(
        ({ gateway }) => ({ gateway }),
        async (error) => {
          await stopAll();
          started = null;
          throw error;
        },
      );
      return started;
    },
    stop() {
      stopped ??= (async () => {
        await started?.catch(() => {});
        await stopAll();
        await connection?.close().catch((err) => log.warn({ err }, 'error while closing Temporal'));
        await database.close();
      })();
      return stopped;
    },
  };
}
