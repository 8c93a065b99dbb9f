import { randomBytes } from 'node:crypto';
import { rmSync } from 'node:fs';
import path from 'node:path';
import type { Client } from '@temporalio/client';
import { parseConfig } from '../../core/config.ts';
import type { Db } from '../../core/database.ts';
import type { Logger } from '../../core/logger.ts';
import { type SimulatedFleet, startSimulatedFleet } from '../../daemon/sim.ts';
import { ensureCaCertificate } from '../../db/nodes/certificate-authority.ts';
import { createJoinToken } from '../../db/nodes/join-tokens.ts';
import { createDb } from '../../db/pool.ts';
import { createSealer } from '../../domain/sealing.ts';
import { bootstrapPlatform } from '../../iam/bootstrap.ts';
import { createEmbeddedIam } from '../../iam/embedded/index.ts';
import { type Cluster, startCluster } from '../../server/cluster.ts';
import { connectTemporal, temporalTls } from '../../temporal/client.ts';
import { defaultToolsDir } from '../../temporal/dev-server.ts';
import { eventually } from '../support/eventually.ts';
import { seedPool } from '../support/fleet.ts';
import { type TenantMember, tenantMember } from '../support/iam.ts';
import { testLogger } from '../support/logger.ts';
import { makeStackDir } from '../support/temp-dir.ts';

/** The production-shaped cluster (server/cluster.ts) with a pool, tenant acme and `nodes` simulated servers. */
export interface ClusterStack {
  cluster: Cluster;
  log: Logger;
  db: Db;
  temporalClient: Client;
  fleet: SimulatedFleet;
  poolId: string;
  acme: TenantMember;
  /** How many simulated nodes hold a session now, and how many dial each gateway. */
  connected(): { connected: number; byGateway: Record<string, number> };
  stop(): Promise<void>;
}

export async function startClusterStack(input: { nodes: number }): Promise<ClusterStack> {
  const log = testLogger('cluster', process.env.LOG_LEVEL ?? 'warn');
  const dir = makeStackDir('bc-cluster-');
  const stops: Array<() => Promise<void>> = [];
  const stopAll = async () => {
    for (const stop of stops.reverse()) await stop().catch(() => {});
    // BC_CLUSTER_TEST_KEEP=1 keeps the data and every process's log (`<dir>/logs`) to read afterwards.
    if (process.env.BC_CLUSTER_TEST_KEEP) console.log(`cluster data and logs kept in ${dir}`);
    else rmSync(dir, { recursive: true, force: true });
  };
  try {
    const secret = randomBytes(32).toString('base64url');
    const cluster = await startCluster({
      log,
      dataDir: dir,
      toolsDir: process.env.BETTER_COMPUTE_TOOLS_DIR ?? defaultToolsDir(),
      env: { PATH: process.env.PATH, HOME: process.env.HOME },
      planeEnv: {
        BETTER_COMPUTE_SECRET: secret,
        // The load must never meet the rate limits: they are not what this test is about.
        BETTER_COMPUTE_RATE_LIMIT_PER_TOKEN: '0',
        BETTER_COMPUTE_RATE_LIMIT_PER_TENANT: '0',
        BETTER_COMPUTE_GATEWAY_LEASE_SECONDS: '10',
        BETTER_COMPUTE_GATEWAY_JOINS_PER_SECOND_PER_PEER: '1000',
        BETTER_COMPUTE_GATEWAY_JOINS_PER_SECOND: '1000',
        LOG_LEVEL: 'warn',
      },
    });
    stops.push(cluster.stop);
    const handle = createDb(cluster.databaseUrl, { max: 6, applicationName: 'cluster-test' });
    stops.push(handle.close);
    const tls = temporalTls(parseConfig(cluster.planeEnv));
    const temporal = await connectTemporal({
      address: cluster.temporalAddress,
      namespace: cluster.namespace,
      ...(tls ? { tls } : {}),
    });
    stops.push(temporal.close);

    const iam = createEmbeddedIam({ db: handle.db, log });
    await bootstrapPlatform(iam);
    const acme = await tenantMember(iam, 'acme');
    const { poolId } = await seedPool(handle.db, {
      ownerTenantId: 'platform',
      site: 'cluster-site',
      offers: { acme: { gpu: 100_000 } },
    });
    const caCertificatePem = await ensureCaCertificate(handle.db, {
      trustDomain: 'better-compute.local',
      sealer: () => createSealer(secret),
    });
    const { token } = await createJoinToken(handle.db, { poolId, ttlSeconds: 600, maxUses: input.nodes });
    const fleet = await startSimulatedFleet({
      gatewayAddress: cluster.gatewayAddresses[0]!,
      gatewayAddresses: cluster.gatewayAddresses,
      caCertificatePem,
      joinToken: token,
      nodes: input.nodes,
      rootDir: path.join(dir, 'nodes'),
      log,
      minBackoffMs: 200,
      maxBackoffMs: 2_000,
      joinConcurrency: 8,
    });
    stops.push(fleet.stop);
    await eventually(async () => {
      const ready = await handle.db
        .selectFrom('nodes')
        .where('pool_id', '=', poolId)
        .where('provision_state', '=', 'ready')
        .select((eb) => eb.fn.countAll<number>().as('n'))
        .executeTakeFirstOrThrow();
      return Number(ready.n) === input.nodes;
    }, 120_000);

    return {
      cluster,
      log,
      db: handle.db,
      temporalClient: temporal.client,
      fleet,
      poolId,
      acme,
      connected: () => {
        const byGateway: Record<string, number> = {};
        let connected = 0;
        for (const node of fleet.nodes) {
          if (!node.agent.status.connected) continue;
          connected++;
          byGateway[node.agent.status.gateway] = (byGateway[node.agent.status.gateway] ?? 0) + 1;
        }
        return { connected, byGateway };
      },
      stop: stopAll,
    };
  } catch (error) {
    await stopAll();
    throw error;
  }
}
