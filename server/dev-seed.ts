import path from 'node:path';
import { sql } from 'kysely';
import type { Logger } from '../core/logger.ts';
import { startSimulatedFleet } from '../daemon/sim.ts';
import { createJoinToken } from '../db/nodes/join-tokens.ts';
import { bootstrapPlatform } from '../iam/bootstrap.ts';
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
      caCertificatePem: plane.gateway.caCertificatePem,
      joinToken: joinToken.token,
      nodes: sim,
      rootDir: path.join(input.dataDir, 'sim'),
      log: log.child({ component: 'sim' }),
    });
    stopFleet = fleet.stop;
    await waitForReadyNodes(plane, pool.id, sim, log);
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
    pools: [{ ...pool, nodes: Number(rows[0]!.nodes), gpus: Number(rows[0]!.gpus) }],
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
