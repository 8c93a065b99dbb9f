import { z } from 'zod';
import { findOwnedPool, listHoldKinds, upsertHoldKind } from '../../db/holds/kinds.ts';
import { holdKindSchema, listHoldKindsInput, setHoldKindInput } from '../../domain/holds.ts';
import { defineMethod } from '../method.ts';
import { preCheckTenant, requireOnTenant } from '../reservations/access.ts';

const set = defineMethod({
  summary:
    "Declares a workload kind of a pool the tenant owns: the CPU cores, RAM GiB and VRAM GiB one hold of it takes on a host, and its holds' default TTL. The size of a hold always comes from its kind.",
  action: 'compute:pools:declare-kinds',
  input: setHoldKindInput,
  output: holdKindSchema,
  handler: async (ctx, input) => {
    await preCheckTenant(ctx, input.tenantId);
    const pool = await findOwnedPool(ctx.deps.db, input.tenantId, input.pool);
    await ctx.deps.iam.require(
      ctx.principal,
      'compute:pools:declare-kinds',
      { type: 'compute-pool', id: pool.id, tenantId: input.tenantId },
      { requestId: ctx.requestId },
    );
    return upsertHoldKind(ctx.deps.db, {
      poolId: pool.id,
      name: input.name,
      cpuCores: input.cpuCores,
      ramGiB: input.ramGiB,
      vramGiB: input.vramGiB,
      ttlSeconds: input.ttlSeconds,
    });
  },
});

const list = defineMethod({
  summary: 'The workload kinds of the pools the tenant owns or is offered, and what one hold of each takes.',
  action: 'compute:capacity:read',
  input: listHoldKindsInput,
  output: z.object({ kinds: z.array(holdKindSchema) }),
  handler: async (ctx, input) => {
    await requireOnTenant(ctx, input.tenantId, 'compute:capacity:read');
    return { kinds: await listHoldKinds(ctx.deps.db, input) };
  },
});

/** `holds.kinds.set` and `holds.kinds.list`. */
export const holdKindMethods = { 'kinds.set': set, 'kinds.list': list };
