import path from 'node:path';
import { sql } from 'kysely';
import type { Logger } from '../core/logger.ts';
import { startSimulatedFleet } from '../daemon/sim.ts';
import { createJoinToken } from '../db/nodes/join-tokens.ts';
import { labelPoolInRuns } from '../db/nodes/labels.ts';
import type { ReleaseTrust } from '../domain/release-manifest.ts';
import { bootstrapPlatform } from '../iam/bootstrap.ts';
import { devReleaseVersions } from './dev-releases.ts';
import { seedDemo } from './seed-demo.ts';
import type { ControlPlane } from './serve.ts';

/**
 * The dev stack's demo: the platform (root tenant and its admin token), tenant `acme` and the
 * H100 pool seeded through the admin API, and `sim` simulated servers that join the pool with a
 * join token like real ones. Waits until every simulated node is ready and connected.
 */
export async function seedDevStack(input: {
  plane: ControlPlane;
  sim: number;
  dataDir: string;
  log: Logger;
  /** The release signers the simulated bcds pin. */
  releaseTrust?: ReleaseTrust;
  /** Several gateways (`dev --cluster`): the simulated servers are spread over them and fail over. */
  gatewayAddresses?: string[];
}) {
  const { plane, sim, log } = input;
  const { db } = plane.deps;
  const boot = await bootstrapPlatform(plane.iam, { tokenName: 'dev-stack' });
  const demo = await seedDemo(plane.compute, boot.rootAdminToken, { simNodes: sim, db });
  const pool = demo.pools[0]!;

  let stopFleet = async () => {};
  if (sim > 0) {
    if (!plane.gateway) throw new Error('the dev stack needs the gateway to run simulated nodes');
    // Nodes that joined on an earlier run keep their identity; the token only admits new ones.
    const joinToken = await createJoinToken(db, {
      poolId: pool.id,
      ttlSeconds: 600,
      maxUses: sim,
      createdBy: boot.rootAdminIdentityId,
    });
    log.info({ nodes: sim }, 'starting simulated GPU servers');
    const fleet = await startSimulatedFleet({
      gatewayAddress: plane.gateway.address,
      ...(input.gatewayAddresses ? { gatewayAddresses: input.gatewayAddresses } : {}),
      caCertificatePem: plane.gateway.caCertificatePem,
      joinToken: joinToken.token,
      nodes: sim,
      rootDir: path.join(input.dataDir, 'sim'),
      log: log.child({ component: 'sim' }),
      bcd: {
        version: devReleaseVersions.current,
        ...(input.releaseTrust ? { trust: input.releaseTrust } : {}),
      },
    });
    // One simulated H100 server in MIG mode (seven 1g.10gb instances per GPU) for pool h100-mig.
    const migPool = demo.pools.find((p) => p.name === 'h100-mig')!;
    const migToken = await createJoinToken(db, {
      poolId: migPool.id,
      ttlSeconds: 600,
      maxUses: 1,
      createdBy: boot.rootAdminIdentityId,
    });
    const migFleet = await startSimulatedFleet({
      gatewayAddress: plane.gateway.address,
      caCertificatePem: plane.gateway.caCertificatePem,
      joinToken: migToken.token,
      nodes: 1,
      namePrefix: 'mig',
      shape: { gpus: 2, vcpu: 64, memoryGiB: 512, migProfiles: Array(7).fill('1g.10gb') },
      rootDir: path.join(input.dataDir, 'sim-mig'),
      log: log.child({ component: 'sim' }),
    });
    // One simulated server for pool k8s whose bcd serves its device plugin to an in-process kubelet
    // stand-in (reserve --pool k8s --kubernetes).
    const k8sPool = demo.pools.find((p) => p.name === 'k8s')!;
    const k8sToken = await createJoinToken(db, {
      poolId: k8sPool.id,
      ttlSeconds: 600,
      maxUses: 1,
      createdBy: boot.rootAdminIdentityId,
    });
    const k8sFleet = await startSimulatedFleet({
      gatewayAddress: plane.gateway.address,
      caCertificatePem: plane.gateway.caCertificatePem,
      joinToken: k8sToken.token,
      nodes: 1,
      namePrefix: 'k8s',
      shape: { gpus: 4, nvlinkDomainSize: 2 },
      rootDir: path.join(input.dataDir, 'sim-k8s'),
      log: log.child({ component: 'sim' }),
      kubelet: 'stand-in',
    });
    stopFleet = async () => {
      await Promise.all([fleet.stop(), migFleet.stop(), k8sFleet.stop()]);
    };
    await waitForReadyNodes(plane, pool.id, sim, log);
    await waitForReadyNodes(plane, migPool.id, 1, log);
    await waitForReadyNodes(plane, k8sPool.id, 1, log);
    // Two fabric domains, so a newcomer can try a gang with --topology-key fabric.domain.
    const domains = await labelPoolInRuns(db, {
      poolId: pool.id,
      key: 'fabric.domain',
      values: ['fabric-a', 'fabric-b'],
    });
    log.info({ domains }, 'labelled the simulated fleet with fabric.domain');
  }
  const { rows } = await sql<{ nodes: string; gpus: string }>`
    SELECT count(DISTINCT n.id) AS nodes, count(d.id) AS gpus
    FROM nodes n LEFT JOIN devices d ON d.node_id = n.id AND d.class = 'gpu' AND d.removed_at IS NULL
    WHERE n.pool_id = ${pool.id} AND n.provision_state = 'ready'`.execute(db);
  return {
    tenants: {
      root: demo.tenants.root,
      acme: { id: demo.tenants.acme.id, token: demo.tenants.acme.token },
    },
    pools: [
      { ...pool, nodes: Number(rows[0]!.nodes), gpus: Number(rows[0]!.gpus) },
      ...demo.pools
        .filter((p) => p.name === 'h100-mig')
        .map((p) => ({ ...p, nodes: sim > 0 ? 1 : 0, gpus: sim > 0 ? 2 : 0 })),
      ...demo.pools
        .filter((p) => p.name === 'k8s')
        .map((p) => ({ ...p, nodes: sim > 0 ? 1 : 0, gpus: sim > 0 ? 4 : 0 })),
    ],
    stop: stopFleet,
  };
}

async function waitForReadyNodes(plane: ControlPlane, poolId: string, expected: number, log: Logger) {
  const deadline = Date.now() + 120_000;
  let ready = 0;
  while (Date.now() < deadline) {
    const { rows } = await sql<{ n: string }>`
      SELECT count(*) AS n FROM nodes
      WHERE pool_id = ${poolId} AND provision_state = 'ready' AND connectivity = 'connected'
        AND observed_generation IS NOT NULL`.execute(plane.deps.db);
    ready = Number(rows[0]!.n);
    if (ready >= expected) return;
    await new Promise((r) => setTimeout(r, 250));
  }
  log.warn({ ready, expected }, 'not every simulated node became ready in time; continuing');
}
