import { mkdirSync, renameSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { type Config, parseConfig } from '../core/config.ts';
import type { Logger } from '../core/logger.ts';
import { ensureCaCertificate } from '../db/nodes/certificate-authority.ts';
import { createDb } from '../db/pool.ts';
import { createSealer } from '../domain/sealing.ts';
import { createEmbeddedIam } from '../iam/embedded/index.ts';
import { connectTemporal, temporalTls } from '../temporal/client.ts';
import { defaultToolsDir } from '../temporal/dev-server.ts';
import { createTemporalLifecycle } from '../temporal/lifecycle.ts';
import { type Cluster, type ClusterMember, startCluster } from './cluster.ts';
import { createCompute } from './compute.ts';
import { devReleaseSigner, seedDevReleases } from './dev-releases.ts';
import { devDeploymentSecret } from './dev-secret.ts';
import { seedDevStack } from './dev-seed.ts';
import type { DevStackInfo } from './dev-stack.ts';
import type { ControlPlane } from './serve.ts';

/**
 * What `.data/cluster/dev.json` holds: the dev stack's fields (but the bare-metal site, which
 * `dev --cluster` does not seed), and every process of the cluster.
 */
export interface DevClusterInfo extends Omit<DevStackInfo, 'sites' | 'profiles'> {
  gatewayAddresses: string[];
  temporalCaPath: string;
  processes: Array<{ name: string; pid: number; address: string | null; logFile: string }>;
}

export interface DevCluster {
  info: DevClusterInfo;
  cluster: Cluster;
  stop(): Promise<void>;
}

/**
 * `better-compute dev --cluster`: the production shape (server/cluster.ts) in `<data dir>/cluster`,
 * seeded like `dev` (tenants, pools, releases) through the cluster's database, with `sim` simulated
 * servers spread over the gateways. Stops everything it started if a step fails.
 */
export async function startDevCluster(options: {
  config: Config;
  log: Logger;
  sim: number;
}): Promise<DevCluster> {
  const { config, log } = options;
  if (config.DATABASE_URL || config.TEMPORAL_ADDRESS) {
    throw new Error(
      "dev --cluster starts its own PostgreSQL and Temporal cluster: unset DATABASE_URL and TEMPORAL_ADDRESS (or run `serve` processes against them as the README's production section shows)",
    );
  }
  const dataDir = path.resolve(config.BETTER_COMPUTE_DATA_DIR, 'cluster');
  mkdirSync(dataDir, { recursive: true });
  const signer = devReleaseSigner(dataDir);
  const planeEnv: Record<string, string> = {
    BETTER_COMPUTE_SECRET: config.BETTER_COMPUTE_SECRET ?? devDeploymentSecret(dataDir, log),
    BETTER_COMPUTE_RELEASE_PINS: [...config.BETTER_COMPUTE_RELEASE_PINS, signer.pin].join(','),
    BETTER_COMPUTE_WEBHOOK_ALLOW_HOSTS:
      process.env.BETTER_COMPUTE_WEBHOOK_ALLOW_HOSTS ?? 'localhost,127.0.0.1,[::1]',
    LOG_LEVEL: config.LOG_LEVEL,
  };
  const cluster = await startCluster({
    log,
    dataDir,
    toolsDir: config.BETTER_COMPUTE_TOOLS_DIR ?? defaultToolsDir(),
    env: process.env,
    planeEnv,
  });
  const stops: Array<() => Promise<void>> = [cluster.stop];
  const stopAll = async () => {
    for (const stop of stops.reverse())
      await stop().catch((err) => log.warn({ err }, 'error while stopping'));
  };
  try {
    // This process seeds through the same database and Temporal as the cluster's processes.
    const planeConfig = parseConfig(cluster.planeEnv);
    const handle = createDb(cluster.databaseUrl, { max: 4, applicationName: 'dev-cluster' });
    stops.push(handle.close);
    const tls = temporalTls(planeConfig);
    const temporal = await connectTemporal({
      address: cluster.temporalAddress,
      namespace: cluster.namespace,
      ...(tls ? { tls } : {}),
    });
    stops.push(temporal.close);
    const iam = createEmbeddedIam({ db: handle.db, log: log.child({ component: 'iam' }) });
    const lifecycle = createTemporalLifecycle(temporal.client, {
      taskQueue: planeConfig.BETTER_COMPUTE_TASK_QUEUE,
    });
    const deps = { config: planeConfig, db: handle.db, log, iam, temporal: temporal.client, lifecycle };
    const caCertificatePem = await ensureCaCertificate(handle.db, {
      trustDomain: planeConfig.BETTER_COMPUTE_TRUST_DOMAIN,
      sealer: () => createSealer(planeConfig.BETTER_COMPUTE_SECRET!),
    });
    const plane: ControlPlane = {
      deps,
      iam,
      compute: createCompute(deps),
      apiUrl: cluster.apiUrl,
      gateway: { address: cluster.gatewayAddresses[0]!, caCertificatePem },
      stop: async () => {},
    };
    const demo = await seedDevStack({
      plane,
      sim: options.sim,
      dataDir,
      log,
      releaseTrust: { pins: [signer.pin], threshold: 1 },
      gatewayAddresses: cluster.gatewayAddresses,
    });
    stops.push(demo.stop);
    const releases = await seedDevReleases({
      plane,
      dataDir,
      rootToken: demo.tenants.root.token,
      poolId: demo.pools[0]!.id,
      signer,
      log,
    });
    const describe = (m: ClusterMember) => ({
      name: m.name,
      pid: m.pid(),
      address: m.address,
      logFile: m.logFile,
    });
    const info: DevClusterInfo = {
      apiUrl: cluster.apiUrl,
      temporalAddress: cluster.temporalAddress,
      temporalUiUrl: null,
      databaseUrl: cluster.databaseUrl,
      gatewayAddress: cluster.gatewayAddresses[0]!,
      gatewayAddresses: cluster.gatewayAddresses,
      temporalCaPath: cluster.temporalCaPath,
      tenants: demo.tenants,
      pools: demo.pools,
      releases,
      releaseSigner: { keyFile: signer.keyFile, pin: signer.pin },
      processes: cluster.members.map(describe),
    };
    const devJson = path.join(dataDir, 'dev.json');
    writeFileSync(`${devJson}.tmp`, `${JSON.stringify(info, null, 2)}\n`, { mode: 0o600 });
    renameSync(`${devJson}.tmp`, devJson);
    return { info, cluster, stop: stopAll };
  } catch (error) {
    await stopAll();
    throw error;
  }
}
