import type { ComputeClient } from '../client/index.ts';
import type { ConnectionOptions } from './context.ts';
import { CliError } from './errors.ts';

/** `--tenant`, or the token's own tenant. */
export async function tenantOf(client: ComputeClient, options: ConnectionOptions): Promise<string> {
  if (options.tenant) return options.tenant;
  return (await client.system.whoami()).tenantId;
}

/**
 * A pool given by name (`h100`) as its id: the pools offered to the tenant, from capacity.get.
 * An id (`pool_…`) passes through untouched.
 */
export async function resolvePool(client: ComputeClient, tenantId: string, pool: string): Promise<string> {
  if (pool.startsWith('pool_')) return pool;
  const { pools } = await client.capacity.get({ tenantId });
  const matches = pools.filter((p) => p.name === pool);
  if (matches.length === 1) return matches[0]!.poolId;
  const known = pools.map((p) => `${p.name} (${p.poolId})`).join(', ') || 'none';
  throw new CliError(
    matches.length === 0
      ? `--pool: tenant ${tenantId} is offered no pool named ${pool}; its pools: ${known}`
      : `--pool: several pools are named ${pool}; pass its id: ${known}`,
  );
}
