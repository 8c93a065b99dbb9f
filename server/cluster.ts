import { execFile } from 'node:child_process';
import { mkdirSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { promisify } from 'node:util';
import type { Logger } from '../core/logger.ts';
import { freePort, startLocalPostgres } from '../db/local-postgres.ts';
import { createCertificateAuthority, issueServerCertificate } from '../domain/pki.ts';
import { connectTemporal, temporalTls } from '../temporal/client.ts';
import { ensureTemporalCli } from '../temporal/dev-server.ts';
import { searchAttributes } from '../workflows/search-attributes.ts';
import {
  type ClusterProcessKind,
  commandArgv,
  deployDir,
  logSaysSince,
  portAnswers,
  readProcfile,
  startClusterChild,
} from './cluster-processes.ts';
import { ensureHaproxy, ensureTemporalServer } from './cluster-tools.ts';
import { type SupervisedServer, type Supervisor, startWatchdog, supervise } from './supervise.ts';

const run = promisify(execFile);

/** One process of the cluster, as the banner and the tests see it. */
export interface ClusterMember {
  /** e.g. `api-1`, `temporal-history`, `postgresql`. */
  name: string;
  kind: ClusterProcessKind | 'postgresql';
  /** What it serves on (`host:port` or a URL), or null (a worker serves nothing). */
  address: string | null;
  logFile: string;
  /** The process running now (a new one after each restart). */
  pid(): number;
  /** SIGKILLs its whole process group (a crash): the supervisor brings it back at the same address. */
  crash(): Promise<void>;
  /** Resolves once a process other than `pid` runs in its place (a restart finished). */
  restartedFrom(pid: number, timeoutMs?: number): Promise<void>;
}

export interface Cluster {
  /** The load balancer in front of the API processes. */
  apiUrl: string;
  temporalAddress: string;
  namespace: string;
  /** The CA the Temporal frontend's certificate is signed by (TEMPORAL_TLS_CA_PATH). */
  temporalCaPath: string;
  databaseUrl: string;
  gatewayAddresses: string[];
  /** The environment every control-plane process of the cluster runs with. */
  planeEnv: Record<string, string>;
  members: ClusterMember[];
  member(name: string): ClusterMember;
  stop(): Promise<void>;
}

export interface ClusterOptions {
  log: Logger;
  /** Where PostgreSQL's data, the certificates and each process's log live. */
  dataDir: string;
  toolsDir: string;
  /** The environment the control-plane processes start from (the parent's, usually). */
  env: Record<string, string | undefined>;
  /** Overrides on top of `env` for the control-plane processes (rate limits, the secret...). */
  planeEnv?: Record<string, string>;
  apis?: number;
  workers?: number;
  gateways?: number;
  /** Temporal history shards (fixed when its database is created). */
  historyShards?: number;
}

/**
 * The production shape on one machine: one PostgreSQL (the control plane's database and
 * Temporal's two), the Temporal server built from its Go module as four processes (history,
 * matching, frontend with TLS, internal worker) on `historyShards` shards, and deploy/Procfile's
 * control-plane processes (`apis` API processes behind HAProxy, `workers` workers, `gateways`
 * gateways), each started from the Procfile line of its kind with deploy/'s configuration files,
 * after the schema set-up, the namespace registration and the migrations ran as steps of their own.
 * Every process runs in a process group of its own under a watchdog (none outlives this one) and
 * is restarted at the same address when it dies, with one line saying so. Whatever started is
 * stopped again if a step fails, and on `stop()` in reverse order.
 */
export async function startCluster(options: ClusterOptions): Promise<Cluster> {
  const { log } = options;
  const dataDir = path.resolve(options.dataDir);
  const logsDir = path.join(dataDir, 'logs');
  mkdirSync(logsDir, { recursive: true });
  const quietLog = log.child({}, { level: 'warn' });
  const watchdog = startWatchdog();
  const stops: Array<() => Promise<void>> = [];
  const members: ClusterMember[] = [];
  const stopAll = async () => {
    for (const stop of stops.reverse())
      await stop().catch((err) => log.warn({ err }, 'error while stopping'));
    await watchdog.stop();
  };

  /** Supervises `start` as `name`, registering it as a member. */
  const keep = async (
    member: Omit<ClusterMember, 'pid' | 'crash' | 'restartedFrom'>,
    start: (logger: Logger) => Promise<SupervisedServer>,
  ): Promise<ClusterMember> => {
    const first = await start(log);
    const supervisor: Supervisor<SupervisedServer> = supervise<SupervisedServer>({
      name: member.name,
      log,
      first,
      restart: () => start(quietLog),
    });
    stops.push(supervisor.stop);
    const full: ClusterMember = {
      ...member,
      pid: () => supervisor.current().pid,
      crash: async () => {
        const current = supervisor.current();
        try {
          process.kill(-current.pid, 'SIGKILL');
        } catch {
          // already gone
        }
        await current.exited;
      },
      restartedFrom: async (pid, timeoutMs = 120_000) => {
        // wall time: waiting for the supervisor's restart
        const deadline = Date.now() + timeoutMs;
        while (supervisor.current().pid === pid) {
          if (Date.now() > deadline)
            throw new Error(`${member.name} was not restarted within ${timeoutMs} ms`);
          await new Promise((resolve) => setTimeout(resolve, 200));
        }
      },
    };
    members.push(full);
    return full;
  };

  try {
    const haproxy = ensureHaproxy(options.toolsDir, log);
    const temporalBinaries = await ensureTemporalServer(options.toolsDir, log);
    const temporalCli = await ensureTemporalCli(options.toolsDir, log);
    const procfile = readProcfile();

    // PostgreSQL: the control plane's database, and Temporal's default and visibility stores.
    const startPostgres = (port: number | undefined, logger: Logger) =>
      startLocalPostgres({
        dataDir: path.join(dataDir, 'postgres'),
        database: 'better_compute',
        log: logger,
        detached: true,
        onSpawn: (pid) => watchdog.watch(pid, 'SIGINT'),
        ...(port ? { port, strictPort: true } : {}),
      });
    let postgresPort: number | undefined;
    let postgresLog = '';
    const postgres = await keep(
      {
        name: 'postgresql',
        kind: 'postgresql',
        address: null,
        logFile: path.join(dataDir, 'postgres', 'server.log'),
      },
      async (logger) => {
        const server = await startPostgres(postgresPort, logger);
        postgresPort = server.port;
        postgresLog = path.join(server.dataDir, 'server.log');
        return server;
      },
    );
    const databaseUrl = `postgres://postgres@127.0.0.1:${postgresPort}/better_compute`;
    postgres.address = databaseUrl;
    postgres.logFile = postgresLog;

    // Temporal's ports, and its frontend's certificate from a CA of the cluster's own.
    const port = async () => freePort();
    // Temporal keeps its services' ports in a smallint column: they must be below 32768 (freePort's are).
    const temporalPort = port;
    const temporalPorts = {
      TEMPORAL_FRONTEND_PORT: await temporalPort(),
      TEMPORAL_FRONTEND_MEMBERSHIP_PORT: await temporalPort(),
      TEMPORAL_FRONTEND_HTTP_PORT: await temporalPort(),
      TEMPORAL_HISTORY_PORT: await temporalPort(),
      TEMPORAL_HISTORY_MEMBERSHIP_PORT: await temporalPort(),
      TEMPORAL_MATCHING_PORT: await temporalPort(),
      TEMPORAL_MATCHING_MEMBERSHIP_PORT: await temporalPort(),
      TEMPORAL_WORKER_PORT: await temporalPort(),
      TEMPORAL_WORKER_MEMBERSHIP_PORT: await temporalPort(),
    };
    const tlsDir = path.join(dataDir, 'tls');
    mkdirSync(tlsDir, { recursive: true });
    const ca = await createCertificateAuthority('temporal.cluster.local');
    const frontendCert = await issueServerCertificate({
      ca,
      trustDomain: 'temporal.cluster.local',
      hosts: ['127.0.0.1', 'localhost'],
    });
    const temporalCaPath = path.join(tlsDir, 'temporal-ca.pem');
    writeFileSync(temporalCaPath, ca.certificatePem);
    writeFileSync(path.join(tlsDir, 'frontend.pem'), frontendCert.certificatePem);
    writeFileSync(path.join(tlsDir, 'frontend-key.pem'), frontendCert.privateKeyPem, { mode: 0o600 });

    const temporalEnv: Record<string, string> = {
      ...Object.fromEntries(Object.entries(temporalPorts).map(([k, v]) => [k, String(v)])),
      PATH: process.env.PATH ?? '',
      HOME: process.env.HOME ?? '',
      TEMPORAL_SERVER: temporalBinaries.server,
      TEMPORAL_SQL_TOOL: temporalBinaries.sqlTool,
      TEMPORAL_CLI: temporalCli,
      BC_DEPLOY_DIR: deployDir.replace(/\/$/, ''),
      TEMPORAL_DYNAMIC_CONFIG: path.join(deployDir, 'temporal', 'dynamicconfig.yaml'),
      TEMPORAL_HISTORY_SHARDS: String(options.historyShards ?? 4),
      TEMPORAL_LOG_LEVEL: options.env.TEMPORAL_LOG_LEVEL ?? 'warn',
      TEMPORAL_DB_HOST: '127.0.0.1',
      TEMPORAL_DB_PORT: String(postgresPort),
      TEMPORAL_DB_USER: 'postgres',
      TEMPORAL_DB_PASSWORD: '',
      TEMPORAL_FRONTEND_TLS_CERT_FILE: path.join(tlsDir, 'frontend.pem'),
      TEMPORAL_FRONTEND_TLS_KEY_FILE: path.join(tlsDir, 'frontend-key.pem'),
      TEMPORAL_FRONTEND_TLS_CA_FILE: temporalCaPath,
    };
    await run(path.join(deployDir, 'temporal', 'setup-schema.sh'), [], { env: temporalEnv });
    log.info('Temporal schema set up on PostgreSQL (default and visibility stores)');

    const temporalAddress = `127.0.0.1:${temporalPorts.TEMPORAL_FRONTEND_PORT}`;
    // Dialled by name (the certificate carries `localhost` too): TLS forbids an IP as server name.
    const tlsConfig = {
      TEMPORAL_TLS: 'true' as const,
      TEMPORAL_TLS_CA_PATH: temporalCaPath,
      TEMPORAL_TLS_SERVER_NAME: 'localhost',
    };
    const tls = temporalTls(tlsConfig);
    const temporalService = (kind: ClusterProcessKind, servicePort: number) =>
      keep(
        {
          name: kind,
          kind,
          address: `127.0.0.1:${servicePort}`,
          logFile: path.join(logsDir, `${kind}.log`),
        },
        () =>
          startClusterChild({
            name: kind,
            argv: commandArgv(procfile[kind], temporalEnv),
            env: temporalEnv,
            logFile: path.join(logsDir, `${kind}.log`),
            watchdog,
            ready: async () => {
              if (!(await portAnswers(servicePort))) return false;
              if (kind !== 'temporal-frontend') return true;
              const client = await connectTemporal({
                address: temporalAddress,
                connectTimeoutMs: 1_000,
                tls,
              });
              await client.close();
              return true;
            },
          }),
      );
    // One at a time: the first writes the cluster's metadata (two at once race on it), and the
    // frontend and the internal worker find history and matching through membership.
    await temporalService('temporal-history', temporalPorts.TEMPORAL_HISTORY_PORT);
    await temporalService('temporal-matching', temporalPorts.TEMPORAL_MATCHING_PORT);
    await temporalService('temporal-frontend', temporalPorts.TEMPORAL_FRONTEND_PORT);
    // The internal worker serves no gRPC: it is up once it answers on its membership port.
    await temporalService('temporal-worker', temporalPorts.TEMPORAL_WORKER_MEMBERSHIP_PORT);

    const namespace = options.env.TEMPORAL_NAMESPACE ?? 'default';
    const registerEnv = {
      ...temporalEnv,
      TEMPORAL_ADDRESS: temporalAddress,
      TEMPORAL_NAMESPACE: namespace,
      TEMPORAL_TLS: 'true',
      TEMPORAL_TLS_CA_PATH: temporalCaPath,
      TEMPORAL_TLS_SERVER_NAME: 'localhost',
    };
    await eventuallyRun(path.join(deployDir, 'temporal', 'register-namespace.sh'), registerEnv, 60_000);
    await waitForNamespace(temporalAddress, namespace, tls!);
    log.info({ namespace }, 'Temporal namespace and search attributes registered');

    // The control plane: migrations as a step of their own, then the processes of the Procfile.
    const planeEnv: Record<string, string> = {
      ...(Object.fromEntries(Object.entries(options.env).filter(([, v]) => v !== undefined)) as Record<
        string,
        string
      >),
      ...options.planeEnv,
      DATABASE_URL: databaseUrl,
      TEMPORAL_ADDRESS: temporalAddress,
      TEMPORAL_NAMESPACE: namespace,
      TEMPORAL_TLS: 'true',
      TEMPORAL_TLS_CA_PATH: temporalCaPath,
      TEMPORAL_TLS_SERVER_NAME: 'localhost',
      LOG_FORMAT: 'json',
      // Readiness is read from each process's log (`worker running`...): info at least.
      LOG_LEVEL: ['debug', 'trace'].includes(options.planeEnv?.LOG_LEVEL ?? '')
        ? options.planeEnv!.LOG_LEVEL!
        : 'info',
      BETTER_COMPUTE_DB_POOL_MAX: options.planeEnv?.BETTER_COMPUTE_DB_POOL_MAX ?? '10',
    };
    await run(...migrateArgv(planeEnv));
    log.info('control-plane migrations applied');

    const plane = async (
      kind: 'api' | 'worker' | 'gateway',
      index: number,
      extra: Record<string, string>,
      address: string | null,
      ready: (logFile: string, logFrom: number) => Promise<boolean>,
    ) => {
      const name = `${kind}-${index}`;
      const logFile = path.join(logsDir, `${name}.log`);
      const env = { ...planeEnv, ...extra };
      return keep({ name, kind, address, logFile }, () =>
        startClusterChild({
          name,
          argv: commandArgv(procfile[kind], env),
          env,
          logFile,
          watchdog,
          ready: (from) => ready(logFile, from),
        }),
      );
    };

    const gatewayPorts = await Promise.all(Array.from({ length: options.gateways ?? 2 }, port));
    const gatewayAddresses = gatewayPorts.map((p) => `127.0.0.1:${p}`);
    // One gateway first: it creates the machine CA the others then load.
    for (const [i, gatewayPort] of gatewayPorts.entries()) {
      await plane(
        'gateway',
        i + 1,
        { BETTER_COMPUTE_GATEWAY_PORT: String(gatewayPort) },
        gatewayAddresses[i]!,
        (file, from) => Promise.resolve(logSaysSince(file, from, '"gateway listening"')),
      );
    }
    const apiPorts = await Promise.all(Array.from({ length: options.apis ?? 2 }, port));
    await Promise.all([
      ...Array.from({ length: options.workers ?? 2 }, (_, i) =>
        plane('worker', i + 1, {}, null, (file, from) =>
          Promise.resolve(logSaysSince(file, from, '"worker running"')),
        ),
      ),
      ...apiPorts.map((apiPort, i) =>
        plane(
          'api',
          i + 1,
          { BETTER_COMPUTE_API_PORT: String(apiPort) },
          `http://127.0.0.1:${apiPort}`,
          async () => (await fetch(`http://127.0.0.1:${apiPort}/healthz`)).ok,
        ),
      ),
    ]);

    const lbPort = await port();
    const apiUrl = `http://127.0.0.1:${lbPort}`;
    const lbEnv: Record<string, string> = {
      HAPROXY: haproxy.binary,
      LD_LIBRARY_PATH: haproxy.libraryPath,
      BC_DEPLOY_DIR: temporalEnv.BC_DEPLOY_DIR!,
      BC_LB_BIND: `127.0.0.1:${lbPort}`,
      BC_LB_ERRORS: path.join(deployDir, 'haproxy', 'errors'),
      ...Object.fromEntries(apiPorts.map((p, i) => [`BC_API_${i + 1}`, `127.0.0.1:${p}`])),
    };
    await keep(
      {
        name: 'load-balancer',
        kind: 'load-balancer',
        address: apiUrl,
        logFile: path.join(logsDir, 'load-balancer.log'),
      },
      () =>
        startClusterChild({
          name: 'load-balancer',
          argv: commandArgv(procfile['load-balancer'], lbEnv),
          env: lbEnv,
          logFile: path.join(logsDir, 'load-balancer.log'),
          watchdog,
          // SIGUSR1 is HAProxy's soft stop: it finishes what is in flight, then exits.
          stopSignal: 'SIGUSR1',
          ready: async () => (await fetch(`${apiUrl}/healthz`)).ok,
        }),
    );

    return {
      apiUrl,
      temporalAddress,
      namespace,
      temporalCaPath,
      databaseUrl,
      gatewayAddresses,
      planeEnv,
      members,
      member: (name) => {
        const found = members.find((m) => m.name === name);
        if (!found)
          throw new Error(`no cluster member ${name}: one of ${members.map((m) => m.name).join(', ')}`);
        return found;
      },
      stop: stopAll,
    };
  } catch (error) {
    await stopAll();
    throw error;
  }
}

/** `better-compute migrate` with `env`, as a process of its own (what a deployment runs). */
function migrateArgv(env: Record<string, string>): [string, string[], { env: Record<string, string> }] {
  const [command, ...args] = commandArgv('better-compute migrate', env);
  return [command!, args, { env }];
}

/** Runs `script` until it succeeds (the frontend may still be joining its cluster), or throws its error. */
async function eventuallyRun(script: string, env: Record<string, string>, timeoutMs: number): Promise<void> {
  // wall time: retrying a set-up step while the services come up
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    try {
      await run(script, [], { env });
      return;
    } catch (error) {
      if (Date.now() > deadline) {
        const err = error as { stderr?: string; message: string };
        throw new Error(`${path.basename(script)} failed: ${err.stderr?.trim() || err.message}`);
      }
      await new Promise((resolve) => setTimeout(resolve, 1_000));
    }
  }
}

/**
 * Waits until the frontend serves `namespace` with every search attribute the workflows carry (a
 * new namespace and its aliases reach every service's cache in seconds).
 */
async function waitForNamespace(
  address: string,
  namespace: string,
  tls: NonNullable<ReturnType<typeof temporalTls>>,
): Promise<void> {
  const client = await connectTemporal({ address, namespace, tls });
  const query = Object.values(searchAttributes)
    .map((key) => `${key.name} = 'ready'`)
    .join(' OR ');
  try {
    // wall time: waiting for the namespace cache
    const deadline = Date.now() + 60_000;
    for (;;) {
      try {
        // A query on every search attribute: the frontend refuses one it has no alias for yet.
        await client.connection.workflowService.listWorkflowExecutions({ namespace, pageSize: 1, query });
        return;
      } catch (error) {
        if (Date.now() > deadline) throw error;
        await new Promise((resolve) => setTimeout(resolve, 500));
      }
    }
  } finally {
    await client.close();
  }
}
