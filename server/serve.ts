import type { Client } from '@temporalio/client';
import type { Config, ProcessMode } from '../core/config.ts';
import type { Deps } from '../core/deps.ts';
import type { Logger } from '../core/logger.ts';
import { createDb } from '../db/pool.ts';
import { startWebhookDispatcher } from '../events/webhook-dispatcher.ts';
import { startGateway } from '../gateway/server.ts';
import { createEmbeddedIam, type EmbeddedIam } from '../iam/embedded/index.ts';
import { connectTemporal } from '../temporal/client.ts';
import { createTemporalLifecycle } from '../temporal/lifecycle.ts';
import { startWorker } from '../temporal/worker.ts';
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
    const connection = await connectTemporal({
      address: options.temporalAddress,
      namespace: config.TEMPORAL_NAMESPACE,
    });
    stops.push(connection.close);
    const temporal: Client = connection.client;
    const lifecycle = createTemporalLifecycle(temporal, { taskQueue: config.BETTER_COMPUTE_TASK_QUEUE });
    const deps: Deps = { config, db: handle.db, log, iam, temporal, lifecycle };
    const compute = createCompute(deps);

    let apiUrl: string | null = null;
    if (mode === 'api' || mode === 'all') {
      const server = await listen(
        compute.app,
        config.BETTER_COMPUTE_API_HOST,
        config.BETTER_COMPUTE_API_PORT,
      );
      stops.push(server.stop);
      apiUrl = server.url;
      log.info({ url: apiUrl }, 'API listening');
      // Webhooks are delivered beside the API; a lease per webhook keeps several processes from
      // delivering the same event twice.
      const webhooks = startWebhookDispatcher({ db: handle.db, log });
      stops.push(webhooks.stop);
    }
    if (mode === 'worker' || mode === 'all') {
      const worker = await startWorker({
        db: handle.db,
        log,
        iam,
        address: options.temporalAddress,
        namespace: config.TEMPORAL_NAMESPACE,
        taskQueue: config.BETTER_COMPUTE_TASK_QUEUE,
      });
      stops.push(worker.stop);
      log.info({ taskQueue: config.BETTER_COMPUTE_TASK_QUEUE }, 'worker running');
    }
    let gateway: ControlPlane['gateway'] = null;
    if (mode === 'gateway' || mode === 'all') {
      const started = await startGateway({ config, db: handle.db, log, lifecycle });
      stops.push(started.stop);
      gateway = { address: started.address, caCertificatePem: started.caCertificatePem };
      log.info({ address: started.address }, 'gateway listening');
    }
    return { deps, iam, compute, apiUrl, gateway, stop: stopAll };
  } catch (error) {
    await stopAll();
    throw error;
  }
}
