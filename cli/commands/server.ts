import path from 'node:path';
import type { Command } from 'commander';
import { type ProcessMode, parseConfig, processModes } from '../../core/config.ts';
import { createLogger, type Logger } from '../../core/logger.ts';

// The control plane's modules (Temporal worker, gateway, database) load only when a server command
// runs, so every other command starts fast.

/**
 * Stops `stop` once on SIGINT, SIGTERM or SIGHUP (a closed terminal), then exits. A second signal
 * while stopping ends the process at once (the dev stack's watchdog still stops its servers).
 */
function stopOnSignal(log: Logger, stop: () => Promise<void>) {
  let stopping = false;
  const handler = (signal: NodeJS.Signals) => {
    if (stopping) return;
    stopping = true;
    log.info({ signal }, 'stopping everything this process started');
    stop().then(
      () => process.exit(0),
      (err) => {
        log.error({ err }, 'error while stopping');
        process.exit(1);
      },
    );
  };
  process.once('SIGINT', handler);
  process.once('SIGTERM', handler);
  process.once('SIGHUP', handler);
}

/** Exit status 1: the stack could not start; 2: the command line itself is wrong. */
/** The process's configuration from the environment, or one line saying which variable is wrong. */
function configOrFail(): ReturnType<typeof parseConfig> {
  try {
    return parseConfig();
  } catch (error) {
    fail((error as Error).message);
  }
}

function fail(message: string, status = 1): never {
  console.error(`error: ${message}`);
  process.exit(status);
}

/** Commands that run the control plane itself: `dev`, `serve`, `migrate`. */
export function registerServerCommands(program: Command) {
  program
    .command('dev')
    .description(
      'Run everything locally: PostgreSQL, the Temporal dev server and Web UI, the control plane and simulated GPU servers.',
    )
    .option('--sim <n>', 'simulated GPU servers to start (8 GPUs each)', '8')
    .option('--json', 'print the stack as JSON instead of a summary')
    .option(
      '--cluster',
      'the production shape instead: a Temporal cluster on PostgreSQL, two API processes behind HAProxy, two workers, two gateways (deploy/)',
    )
    .action(async (options: { sim: string; json?: boolean; cluster?: boolean }) => {
      const sim = Number(options.sim);
      if (!Number.isInteger(sim) || sim < 0 || sim > 10_000)
        fail(`--sim must be a whole number from 0 to 10000, got '${options.sim}'`, 2);
      const config = configOrFail();
      // --json keeps stdout machine-readable, log lines included.
      const log = createLogger({
        level: config.LOG_LEVEL,
        format: options.json ? 'json' : config.LOG_FORMAT,
      });
      if (options.cluster) {
        const { startDevCluster } = await import('../../server/cluster-dev.ts');
        let devCluster: Awaited<ReturnType<typeof startDevCluster>>;
        try {
          devCluster = await startDevCluster({ config, log, sim });
        } catch (error) {
          log.debug({ err: error }, 'the cluster did not start');
          fail(`${(error as Error).message} (nothing was left running)`);
        }
        stopOnSignal(log, devCluster.stop);
        const { info } = devCluster;
        if (options.json) console.log(JSON.stringify(info));
        else {
          console.log(
            [
              '',
              'Better Compute cluster is running (Ctrl-C stops every process; a process that dies is restarted).',
              `  API (HAProxy): ${info.apiUrl}`,
              `  Temporal:      ${info.temporalAddress}  (TLS, CA ${info.temporalCaPath})`,
              `  Gateways:      ${info.gatewayAddresses.join(', ')}`,
              `  PostgreSQL:    ${info.databaseUrl}`,
              '  Processes:',
              ...info.processes.map(
                (p) => `    ${p.name.padEnd(18)} pid ${String(p.pid).padEnd(8)} ${p.address ?? '-'}`,
              ),
              `  Logs:          ${path.dirname(info.processes.at(-1)!.logFile)}`,
              `  root token:    ${info.tenants.root.token}   (tenant ${info.tenants.root.id})`,
              `  acme token:    ${info.tenants.acme.token}   (tenant ${info.tenants.acme.id})`,
              ...info.pools.map(
                (p) => `  pool:          ${p.id}  ${p.name}: ${p.nodes} nodes, ${p.gpus} ${p.gpuModel} GPUs`,
              ),
              `  The same as JSON: ${config.BETTER_COMPUTE_DATA_DIR}/cluster/dev.json`,
              '',
            ].join('\n'),
          );
        }
        return;
      }
      const { startDevStack } = await import('../../server/dev-stack.ts');
      let stack: Awaited<ReturnType<typeof startDevStack>>;
      try {
        stack = await startDevStack({ config, log, sim });
      } catch (error) {
        log.debug({ err: error }, 'the dev stack did not start');
        fail(`${(error as Error).message} (nothing was left running)`);
      }
      stopOnSignal(log, stack.stop);
      const { info } = stack;
      if (options.json) console.log(JSON.stringify(info));
      else {
        console.log(
          [
            '',
            'Better Compute dev stack is running (Ctrl-C stops everything).',
            `  API:          ${info.apiUrl}`,
            `  Temporal UI:  ${info.temporalUiUrl ?? `(external Temporal at ${info.temporalAddress})`}`,
            `  Temporal:     ${info.temporalAddress}`,
            `  Gateway:      ${info.gatewayAddress ?? '-'}`,
            `  PostgreSQL:   ${info.databaseUrl}`,
            `  root token:   ${info.tenants.root.token}   (tenant ${info.tenants.root.id})`,
            `  acme token:   ${info.tenants.acme.token}   (tenant ${info.tenants.acme.id})`,
            ...info.pools.map(
              (p) => `  pool:         ${p.id}  ${p.name}: ${p.nodes} nodes, ${p.gpus} ${p.gpuModel} GPUs`,
            ),
            `  The same as JSON: ${config.BETTER_COMPUTE_DATA_DIR}/dev.json`,
            '',
          ].join('\n'),
        );
      }
    });

  program
    .command('serve')
    .description('Run one process of the control plane against DATABASE_URL and TEMPORAL_ADDRESS.')
    .option('--mode <mode>', `what this process runs: ${processModes.join(', ')}`, 'all')
    .action(async (options: { mode: string }) => {
      if (!(processModes as readonly string[]).includes(options.mode)) {
        fail(`--mode must be one of ${processModes.join(', ')}, got '${options.mode}'`, 2);
      }
      const config = configOrFail();
      if (!config.DATABASE_URL)
        fail('DATABASE_URL is not set: point it at the PostgreSQL database (or use `better-compute dev`)');
      if (!config.TEMPORAL_ADDRESS)
        fail('TEMPORAL_ADDRESS is not set: point it at a Temporal frontend (or use `better-compute dev`)');
      const log = createLogger({ level: config.LOG_LEVEL, format: config.LOG_FORMAT });
      const { startControlPlane } = await import('../../server/serve.ts');
      try {
        const plane = await startControlPlane({
          mode: options.mode as ProcessMode,
          config,
          log,
          databaseUrl: config.DATABASE_URL,
          temporalAddress: config.TEMPORAL_ADDRESS,
        });
        stopOnSignal(log, plane.stop);
      } catch (error) {
        fail((error as Error).message);
      }
    });

  program
    .command('migrate')
    .description('Apply pending database migrations to DATABASE_URL (all or nothing).')
    .option('--json', 'print the result as JSON')
    .action(async (options: { json?: boolean }) => {
      const config = configOrFail();
      if (!config.DATABASE_URL)
        fail('DATABASE_URL is not set: point it at the PostgreSQL database to migrate');
      const { migrateDatabase } = await import('../../server/migrate.ts');
      try {
        const { applied } = await migrateDatabase(config.DATABASE_URL);
        if (options.json) console.log(JSON.stringify({ applied }));
        else console.log(applied.length ? `applied ${applied.join(', ')}` : 'the database is up to date');
      } catch (error) {
        fail((error as Error).message);
      }
    });
}
