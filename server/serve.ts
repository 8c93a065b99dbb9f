import type { Client } from '@temporalio/client';
import { assertSecretForMode, type Config, type ProcessMode } from '../core/config.ts';
import type { Deps } from '../core/deps.ts';
import type { Logger } from '../core/logger.ts';
import { createDb } from '../db/pool.ts';
import { startWebhookDispatcher } from '../events/webhook-dispatcher.ts';
import { startGateway } from '../gateway/server.ts';
import { createEmbeddedIam, type EmbeddedIam } from '../iam/embedded/index.ts';
import { connectTemporal, temporalTls } from '../temporal/client.ts';
import { createTemporalLifecycle } from '../temporal/lifecycle.ts';
import { startWorker, type WorkerDeps } from '../temporal/worker.ts';
import { type Compute, createCompute } from './compute.ts';
import { listen } from './http.ts';

export interface ControlPlane {
  deps: Deps;
  iam: EmbeddedIam;
  compute: Compute;
  apiUrl: string | null;
  gateway: { address: string; caCertificatePem: string } | null;
  stop(): Promise<void>;
}

/**
 * Starts one process of the control plane in `mode`: `api` (HTTP), `worker` (Temporal workflows
 * and activities), `gateway` (gRPC sessions of bcd) or `all` three. Whatever started is stopped
 * again if a later part fails, so a failed start leaves nothing running.
 */
export async function startControlPlane(options: {
  mode: ProcessMode;
  config: Config;
  log: Logger;
  databaseUrl: string;
  temporalAddress: string;
}): Promise<ControlPlane> {
  const { mode, config, log } = options;
  // Before anything opens: a mode that seals or opens secrets refuses to start without the secret.
  assertSecretForMode(config, mode);
  const stops: Array<() => Promise<void>> = [];
  const stopAll = async () => {
    for (const stop of stops.reverse())
      await stop().catch((err) => log.warn({ err }, 'error while stopping'));
  };
  try {
    const handle = createDb(options.databaseUrl, { max: config.BETTER_COMPUTE_DB_POOL_MAX });
    stops.push(handle.close);
    const iam = createEmbeddedIam({ db: handle.db, log: log.child({ component: 'iam' }) });
    // Every mode talks to Temporal: the API starts and signals workflows, the gateway signals them
    // after writing a node's report, the worker runs them.
    const tls = temporalTls(config);
    const connection = await connectTemporal({
      address: options.temporalAddress,
      namespace: config.TEMPORAL_NAMESPACE,
      ...(tls ? { tls } : {}),
    });
    stops.push(connection.close);
    const temporal: Client = connection.client;
    const lifecycle = createTemporalLifecycle(temporal, { taskQueue: config.BETTER_COMPUTE_TASK_QUEUE });
    const deps: Deps = { config, db: handle.db, log, iam, temporal, lifecycle };
    const compute = createCompute(deps);
    const { apiUrl, gateway } = await startModeProcesses(
      { mode, deps, listenApp: compute.app, temporal: { address: options.temporalAddress } },
      stops,
    );
    return { deps, iam, compute, apiUrl, gateway, stop: stopAll };
  } catch (error) {
    await stopAll();
    throw error;
  }
}

/**
 * Starts what `mode` runs around the API's methods, pushing each part's stop onto `stops` as soon
 * as it runs: `api` serves `listenApp` on the configured host and port (when given: an embedder
 * mounts its handler in its own server instead) and delivers webhooks; `worker` polls `temporal`
 * (without it no worker runs here: admission still commits, and a worker's sweeper starts the
 * lifecycles later); `gateway` serves bcd sessions unless `gateway` is false.
 */
export async function startModeProcesses(
  input: {
    mode: ProcessMode;
    deps: Deps;
    listenApp?: Compute['app'];
    temporal?: { address: string; sweeper?: WorkerDeps['sweeper'] };
    gateway?: boolean;
  },
  stops: Array<() => Promise<void>>,
): Promise<{ apiUrl: string | null; gateway: ControlPlane['gateway'] }> {
  const { mode, deps } = input;
  const { config, db, log } = deps;
  assertSecretForMode(config, mode);
  let apiUrl: string | null = null;
  if (mode === 'api' || mode === 'all') {
    if (input.listenApp) {
      const server = await listen(
        input.listenApp,
        config.BETTER_COMPUTE_API_HOST,
        config.BETTER_COMPUTE_API_PORT,
      );
      stops.push(server.stop);
      apiUrl = server.url;
      log.info({ url: apiUrl }, 'API listening');
    }
    // Webhooks are delivered beside the API; a lease per webhook keeps several processes from
    // delivering the same event twice.
    const webhooks = startWebhookDispatcher({ db, log, config });
    stops.push(webhooks.stop);
  }
  if (mode === 'worker' || mode === 'all') {
    if (input.temporal) {
      const tls = temporalTls(config);
      const worker = await startWorker({
        db,
        log,
        iam: deps.iam,
        address: input.temporal.address,
        ...(tls ? { tls } : {}),
        namespace: config.TEMPORAL_NAMESPACE,
        taskQueue: config.BETTER_COMPUTE_TASK_QUEUE,
        draftRetentionHours: config.BETTER_COMPUTE_DRAFT_RETENTION_HOURS,
        ...(config.BETTER_COMPUTE_WORKFLOW_CACHE !== undefined
          ? { maxCachedWorkflows: config.BETTER_COMPUTE_WORKFLOW_CACHE }
          : {}),
        ...(input.temporal.sweeper !== undefined ? { sweeper: input.temporal.sweeper } : {}),
      });
      stops.push(worker.stop);
      log.info({ taskQueue: config.BETTER_COMPUTE_TASK_QUEUE }, 'worker running');
    } else {
      log.warn('no Temporal configured: no worker runs here, lifecycles start once a worker sweeps');
    }
  }
  let gateway: ControlPlane['gateway'] = null;
  if ((mode === 'gateway' || mode === 'all') && input.gateway !== false) {
    const started = await startGateway({ config, db, log, lifecycle: deps.lifecycle });
    stops.push(started.stop);
    gateway = { address: started.address, caCertificatePem: started.caCertificatePem };
    log.info({ address: started.address }, 'gateway listening');
  }
  return { apiUrl, gateway };
}
