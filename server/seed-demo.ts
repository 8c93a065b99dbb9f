import { sql } from 'kysely';
import type { Db } from '../core/database.ts';
import { registerReadyNodes } from '../db/nodes/fleet.ts';
import type { Compute } from './compute.ts';

export interface DemoSeed {
  tenants: { root: { id: string; token: string }; acme: { id: string; token: string; identityId: string } };
  pools: Array<{ id: string; name: string; gpuModel: string; nodes: number; gpus: number }>;
  siteId: string;
}

export interface SeedDemoOptions {
  /** How many 8-GPU H100 nodes the demo pool is meant to hold. */
  simNodes: number;
  /**
   * Register the nodes as ready straight in the database (no daemons). Without it the pool starts
   * empty and simulated daemons join it; `db` is needed either way to count the pool's nodes.
   */
  registerNodesDirectly?: boolean;
  db?: Db;
  region?: string;
  /** GPUs of quota acme gets in the demo pool (default: every GPU of the pool, at least 8). */
  acmeGpuQuota?: number;
}

/**
 * Seeds the demo through the admin API methods (the same ones an operator calls): tenant `acme`
 * with an admin person and a fresh token, site `demo-site` in `eu-central-1`, pool `h100` of 8-GPU
 * H100 nodes offered to acme with a GPU quota. Idempotent: a second run reuses what exists and
 * mints a new acme token.
 */
export async function seedDemo(
  compute: Compute,
  rootToken: string,
  options: SeedDemoOptions,
): Promise<DemoSeed> {
  const cred = { token: rootToken };
  const admin = compute.api.admin;
  const who = await compute.api.system.whoami(cred, {});

  const { tenants } = await admin.listTenants(cred, {});
  if (!tenants.some((t) => t.id === 'acme'))
    await admin.createTenant(cred, { id: 'acme', name: 'Acme Corp' });
  const { identities } = await admin.listIdentities(cred, { tenantId: 'acme' });
  const acmeAdmin =
    identities.find((i) => i.name === 'acme-admin') ??
    (await admin.createIdentity(cred, {
      tenantId: 'acme',
      kind: 'person',
      name: 'acme-admin',
      email: 'admin@acme.example',
      roles: ['admin'],
    }));
  await admin.bindRole(cred, { identityId: acmeAdmin.id, role: 'admin', tenantId: 'acme' });
  const acmeToken = await admin.createToken(cred, { identityId: acmeAdmin.id, name: 'dev-stack' });

  const region = options.region ?? 'eu-central-1';
  const { sites } = await admin.listSites(cred, {});
  const site =
    sites.find((s) => s.name === 'demo-site') ??
    (await admin.createSite(cred, { name: 'demo-site', region }));
  const { pools } = await admin.listPools(cred, {});
  const pool =
    pools.find((p) => p.name === 'h100' && p.ownerTenantId === who.tenantId) ??
    (await admin.createPool(cred, { siteId: site.id, name: 'h100', gpuModel: 'h100' }));

  let nodes = 0;
  if (options.db) {
    const { rows } = await sql<{
      n: string;
    }>`SELECT count(*) AS n FROM nodes WHERE pool_id = ${pool.id}`.execute(options.db);
    nodes = Number(rows[0]!.n);
    if (options.registerNodesDirectly && nodes < options.simNodes) {
      await registerReadyNodes(options.db, {
        siteId: site.id,
        poolId: pool.id,
        count: options.simNodes - nodes,
        namePrefix: `demo-${nodes}`,
      });
      nodes = options.simNodes;
    }
  }
  const gpus = Math.max(nodes, options.simNodes) * 8;
  await admin.offer(cred, {
    poolId: pool.id,
    tenantId: 'acme',
    quota: { gpu: options.acmeGpuQuota ?? Math.max(8, gpus) },
  });
  // The workload kinds a hold of the demo pool can take (capacity hold --kind notebook …).
  for (const kind of [
    { name: 'notebook', cpuCores: 2, ramGiB: 4 },
    { name: 'diagnostics', cpuCores: 1, ramGiB: 1 },
  ]) {
    await compute.api.holds['kinds.set'](cred, { tenantId: who.tenantId, pool: pool.id, ...kind });
  }

  // A MIG pool: its GPUs are split into 1g.10gb instances (reserve --pool h100-mig --mig 1g.10gb).
  // Small per-GPU shares, so a request's own --cpus/--memory are what the node enforces.
  const migPool =
    pools.find((p) => p.name === 'h100-mig' && p.ownerTenantId === who.tenantId) ??
    (await admin.createPool(cred, {
      siteId: site.id,
      name: 'h100-mig',
      gpuModel: 'h100',
      sharingMode: 'mig',
      policy: { perGpu: { vcpu: 0, memoryGiB: 0 } },
    }));
  await admin.offer(cred, {
    poolId: migPool.id,
    tenantId: 'acme',
    quota: { 'gpu.mig': 14, vcpu: 16, memoryGiB: 64 },
  });

  // A pool acme owns with policy.kubernetes: its nodes' bcd hands booked GPUs to their kubelet
  // (reserve --pool k8s --kubernetes), only for its owner.
  const k8sPool =
    pools.find((p) => p.name === 'k8s' && p.ownerTenantId === 'acme') ??
    (await admin.createPool(cred, {
      siteId: site.id,
      name: 'k8s',
      gpuModel: 'h100',
      ownerTenantId: 'acme',
      policy: { kubernetes: true, perGpu: { vcpu: 0, memoryGiB: 0 } },
    }));
  await admin.offer(cred, { poolId: k8sPool.id, tenantId: 'acme', quota: { gpu: 8 } });

  return {
    tenants: {
      root: { id: who.tenantId, token: rootToken },
      acme: { id: 'acme', token: acmeToken.token, identityId: acmeAdmin.id },
    },
    pools: [
      { id: pool.id, name: pool.name, gpuModel: pool.gpuModel, nodes, gpus: nodes * 8 },
      { id: migPool.id, name: migPool.name, gpuModel: migPool.gpuModel, nodes: 0, gpus: 0 },
      { id: k8sPool.id, name: k8sPool.name, gpuModel: k8sPool.gpuModel, nodes: 0, gpus: 0 },
    ],
    siteId: site.id,
  };
}
