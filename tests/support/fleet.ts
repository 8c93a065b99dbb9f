import { sql } from 'kysely';
import type { Db } from '../../core/database.ts';
import {
  insertPool,
  insertSite,
  type NodeShape,
  offerPool,
  type RegisteredNode,
  registerReadyNodes,
} from '../../db/nodes/fleet.ts';

/** A small node: two H100s in one NVLink domain, no host resources. */
export const smallShape: NodeShape = {
  gpus: 2,
  gpuModel: 'h100',
  gpuMemoryMiB: 81_559,
  nvlinkDomainSize: 2,
  numaNodes: 1,
  resources: {},
};

export interface SeededPool {
  siteId: string;
  poolId: string;
  nodes: RegisteredNode[];
}

/**
 * A pool in a new site (or in `siteId`), with `nodes` ready nodes of `shape` registered directly
 * (no daemons), offered to each tenant of `offers` with its quota. Defaults: an H100 pool named
 * `h100` owned by `tnt_root`, in site `test-site` of `eu-central-1`, with no nodes and no offers.
 */
export async function seedPool(
  db: Db,
  input: {
    siteId?: string;
    site?: string;
    region?: string;
    name?: string;
    gpuModel?: string;
    ownerTenantId?: string;
    policy?: Record<string, unknown>;
    nodes?: number;
    shape?: NodeShape;
    namePrefix?: string;
    offers?: Record<string, Record<string, number>>;
  } = {},
): Promise<SeededPool> {
  const siteId =
    input.siteId ??
    (await insertSite(db, { name: input.site ?? 'test-site', region: input.region ?? 'eu-central-1' }));
  const gpuModel = input.gpuModel ?? 'h100';
  const poolId = await insertPool(db, {
    siteId,
    ownerTenantId: input.ownerTenantId ?? 'tnt_root',
    name: input.name ?? 'h100',
    gpuModel,
    ...(input.policy ? { policy: input.policy } : {}),
  });
  const nodes = await registerReadyNodes(db, {
    siteId,
    poolId,
    count: input.nodes ?? 0,
    ...(input.shape ? { shape: input.shape } : {}),
    ...(input.namePrefix ? { namePrefix: input.namePrefix } : {}),
  });
  for (const [tenantId, quota] of Object.entries(input.offers ?? {})) {
    await offerPool(db, { poolId, tenantId, quota });
  }
  return { siteId, poolId, nodes };
}

/**
 * Nodes registered without a daemon send no heartbeats, so a gateway's liveness sweep marks them
 * unreachable one lease after they were registered; a test that places on them later says they
 * were just heard from.
 */
export async function markNodesHeard(db: Db, nodeIds: string[]): Promise<void> {
  await sql`UPDATE nodes SET connectivity = 'connected', last_heartbeat_at = compute_now()
            WHERE id = ANY(${nodeIds}::text[])`.execute(db);
  await sql`DELETE FROM node_conditions WHERE node_id = ANY(${nodeIds}::text[]) AND type = 'NodeUnreachable'`.execute(
    db,
  );
}
