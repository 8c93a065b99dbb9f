import type { NodeShape } from '../../db/nodes/fleet.ts';
import { type ApiAnswer, type ApiFixture, createApiFixture } from '../support/api.ts';
import { seedPool } from '../support/fleet.ts';
import { type TenantMember, tenantMember } from '../support/iam.ts';

/** A CPU host shape with `gpus` GPUs and the given cores and GiB. */
export const hostShape = (gpus: number, vcpu: number | null, memoryGiB: number | null): NodeShape => ({
  gpus,
  gpuModel: 'h100',
  gpuMemoryMiB: 81_920,
  nvlinkDomainSize: Math.max(1, gpus),
  numaNodes: 1,
  resources: {
    ...(vcpu !== null ? { vcpu } : {}),
    ...(memoryGiB !== null ? { memoryGiB } : {}),
  },
});

export interface HoldsWorld {
  api: ApiFixture;
  /** A member of tenant `acme`, offered every pool. */
  acme: TenantMember;
  /** The root admin (owns the pools, declares their kinds). */
  root: TenantMember;
  /** Declares `notebook` (2 cores, 4 GiB) and `diagnostics` (1 core, 1 GiB) in the pool. */
  declareKinds(poolId: string): Promise<void>;
  /** A pool owned by root, offered to acme with ample quota, with `nodes` nodes of `shape`. */
  pool(
    name: string,
    nodes: number,
    shape: NodeShape,
  ): Promise<{ poolId: string; nodes: Array<{ id: string; name: string }> }>;
  /** POST as acme's member; answers the parsed body's data or throws with its error. */
  call(path: string, body: unknown, token?: string): Promise<ApiAnswer>;
}

export async function createHoldsWorld(): Promise<HoldsWorld> {
  const api = await createApiFixture({ max: 40 });
  const acme = await tenantMember(api.iam, 'acme');
  const world: HoldsWorld = {
    api,
    acme,
    root: api.root,
    call: (path, body, token) => api.call(token ?? acme.token, path, body),
    declareKinds: async (poolId) => {
      for (const [name, cpuCores, ramGiB] of [
        ['notebook', 2, 4],
        ['diagnostics', 1, 1],
      ] as const) {
        const answer = await api.call(api.root.token, 'holds/kinds.set', {
          tenantId: api.root.tenantId,
          pool: poolId,
          name,
          cpuCores,
          ramGiB,
        });
        if (answer.status !== 200) throw new Error(JSON.stringify(answer.body));
      }
    },
    pool: async (name, nodes, shape) => {
      const seeded = await seedPool(api.database.db, {
        site: `site-${name}`,
        name,
        namePrefix: name,
        ownerTenantId: api.root.tenantId,
        nodes,
        shape,
        offers: { acme: { gpu: 1_000, vcpu: 10_000, memoryGiB: 100_000 } },
      });
      await world.declareKinds(seeded.poolId);
      return { poolId: seeded.poolId, nodes: seeded.nodes };
    },
  };
  return world;
}
