import { sql, type Transaction } from 'kysely';
import type { Database, Db } from '../../core/database.ts';
import { ComputeError } from '../../domain/errors.ts';
import type { Connectivity, NodeRole } from '../../domain/fleet.ts';
import { newId } from '../../domain/ids.ts';
import { canonicalJson, type DeviceAssignment, normalizeAssignments } from '../../domain/node-spec.ts';
import { revokeNodeCertificates } from './certificates.ts';

type Trx = Transaction<Database>;

/**
 * Rewrites the `devices` section of a node's NodeSpec to exactly `assignments`, under the node's
 * row lock, bumping `spec_generation` only when the canonical JSON changes (idempotent). Answers
 * the generation and whether it changed. NOT_FOUND for an unknown node.
 */
export async function setNodeDevicesAssignment(
  trx: Trx,
  nodeId: string,
  assignments: readonly DeviceAssignment[],
): Promise<{ generation: number; changed: boolean }> {
  const node = await trx
    .selectFrom('nodes')
    .where('id', '=', nodeId)
    .select(['spec', 'spec_generation'])
    .forUpdate()
    .executeTakeFirst();
  if (!node) throw new ComputeError('NOT_FOUND', `node ${nodeId} does not exist`);
  const spec = { ...((node.spec ?? {}) as Record<string, unknown>) };
  const next = { ...spec, devices: normalizeAssignments(assignments) };
  if (canonicalJson(next) === canonicalJson(spec)) {
    return { generation: Number(node.spec_generation), changed: false };
  }
  const row = await trx
    .updateTable('nodes')
    .set({
      spec: canonicalJson(next),
      spec_generation: sql<string>`spec_generation + 1`,
      updated_at: sql<Date>`compute_now()`,
    })
    .where('id', '=', nodeId)
    .returning('spec_generation')
    .executeTakeFirstOrThrow();
  return { generation: Number(row.spec_generation), changed: true };
}

/** Sets or clears a node condition (idempotent; `since` is kept while the reason stays). */
export async function setNodeCondition(
  db: Db | Trx,
  nodeId: string,
  condition: { type: string; reason: string; message: string; effect: 'NoSchedule' | null } | null,
  type?: string,
): Promise<void> {
  if (!condition) {
    await db
      .deleteFrom('node_conditions')
      .where('node_id', '=', nodeId)
      .where('type', '=', type ?? '')
      .execute();
    return;
  }
  await sql`
    INSERT INTO node_conditions (node_id, type, reason, message, effect)
    VALUES (${nodeId}, ${condition.type}, ${condition.reason}, ${condition.message}, ${condition.effect})
    ON CONFLICT (node_id, type) DO UPDATE SET
      reason = EXCLUDED.reason, message = EXCLUDED.message, effect = EXCLUDED.effect,
      since = CASE WHEN node_conditions.reason = EXCLUDED.reason THEN node_conditions.since ELSE compute_now() END,
      updated_at = compute_now()`.execute(db);
}

/** Creates a node in a pool (JoinService) with generation 1 of an empty NodeSpec. */
export async function insertJoinedNode(
  trx: Trx,
  input: { siteId: string; poolId: string; name: string; hardwareKey: string | null; role?: NodeRole },
): Promise<{ id: string; name: string }> {
  const id = newId('node');
  const base = input.name;
  for (let attempt = 0; attempt < 5; attempt++) {
    const name = attempt === 0 ? base : `${base}-${id.slice(-4 - attempt)}`;
    const inserted = await trx
      .insertInto('nodes')
      .values({
        id,
        site_id: input.siteId,
        pool_id: input.poolId,
        name,
        role: input.role ?? 'node',
        provision_state: 'enrolling',
        hardware_key: input.hardwareKey,
        spec: canonicalJson({ devices: [] }),
        spec_generation: 1,
      })
      .onConflict((oc) => oc.columns(['site_id', 'name']).doNothing())
      .returning('name')
      .executeTakeFirst();
    if (inserted) return { id, name: inserted.name };
  }
  throw new ComputeError('CONFLICT', `no free node name near ${base} in the site`);
}

/** The node and the tenant that owns its pool (null for a node outside any pool), or null. */
export async function findNodeOwner(
  db: Db,
  nodeId: string,
): Promise<{ id: string; poolId: string | null; ownerTenantId: string | null } | null> {
  const row = await db
    .selectFrom('nodes as n')
    .leftJoin('pools as p', 'p.id', 'n.pool_id')
    .select(['n.id', 'n.pool_id', 'p.owner_tenant_id'])
    .where('n.id', '=', nodeId)
    .executeTakeFirst();
  return row ? { id: row.id, poolId: row.pool_id, ownerTenantId: row.owner_tenant_id } : null;
}

/**
 * Node ids, newest first, after `cursor`: of pools `ownerTenantId` owns when given, of one pool,
 * in one connectivity. At most `limit`.
 */
export async function listNodeIds(
  db: Db,
  filter: {
    ownerTenantId?: string;
    poolId?: string;
    connectivity?: Connectivity;
    cursor?: string;
    limit: number;
  },
): Promise<string[]> {
  let query = db
    .selectFrom('nodes as n')
    .leftJoin('pools as p', 'p.id', 'n.pool_id')
    .select('n.id')
    .orderBy('n.id', 'desc')
    .limit(filter.limit);
  if (filter.ownerTenantId !== undefined) query = query.where('p.owner_tenant_id', '=', filter.ownerTenantId);
  if (filter.poolId) query = query.where('n.pool_id', '=', filter.poolId);
  if (filter.connectivity) query = query.where('n.connectivity', '=', filter.connectivity);
  if (filter.cursor) query = query.where('n.id', '<', filter.cursor);
  return (await query.execute()).map((r) => r.id);
}

/**
 * Sets a node's scheduling flags in the caller's transaction, under its row lock: `cordoned`
 * (no new placements, with `reason`) and `draining` (also the `Draining` NoSchedule condition,
 * cleared again when the node is uncordoned). Idempotent; answers whether anything a caller
 * reports changed (cordoned, or draining started or ended). NOT_FOUND for an unknown node.
 */
export async function setNodeSchedulingFlags(
  trx: Trx,
  input: { nodeId: string; cordoned: boolean; draining: boolean; reason: string | null },
): Promise<{ changed: boolean }> {
  const { nodeId, cordoned, draining } = input;
  const before = await trx
    .selectFrom('nodes')
    .select(['cordoned', 'draining'])
    .where('id', '=', nodeId)
    .forUpdate()
    .executeTakeFirst();
  if (!before) throw new ComputeError('NOT_FOUND', `node ${nodeId} not found`);
  await trx
    .updateTable('nodes')
    .set({
      cordoned,
      draining,
      cordon_reason: cordoned ? input.reason : null,
      updated_at: sql<Date>`compute_now()`,
    })
    .where('id', '=', nodeId)
    .execute();
  if (draining) {
    await setNodeCondition(trx, nodeId, {
      type: 'Draining',
      reason: 'DrainRequested',
      message: input.reason ?? 'nodes.drain',
      effect: 'NoSchedule',
    });
  } else if (!cordoned) {
    await setNodeCondition(trx, nodeId, null, 'Draining');
  }
  const changed =
    before.cordoned !== cordoned || (draining && !before.draining) || (!cordoned && before.draining);
  return { changed };
}

/**
 * The join-time reclaim of a machine the hardware key names, in the caller's transaction under
 * the node's row lock: a node that is not retired is reclaimed (its certificates revoked) and
 * answered; a retired one gives up the key (the machine joins as a new node) and null is answered.
 */
export async function reclaimNodeByHardwareKey(
  trx: Trx,
  hardwareKey: string,
): Promise<{ id: string; name: string; siteId: string; poolId: string | null } | null> {
  const existing = await trx
    .selectFrom('nodes')
    .where('hardware_key', '=', hardwareKey)
    .select(['id', 'name', 'site_id', 'pool_id', 'provision_state'])
    .forUpdate()
    .executeTakeFirst();
  if (!existing) return null;
  if (existing.provision_state === 'retired') {
    await trx.updateTable('nodes').set({ hardware_key: null }).where('id', '=', existing.id).execute();
    return null;
  }
  await revokeNodeCertificates(trx, existing.id);
  await trx
    .updateTable('nodes')
    .set({ updated_at: sql<Date>`compute_now()` })
    .where('id', '=', existing.id)
    .execute();
  return { id: existing.id, name: existing.name, siteId: existing.site_id, poolId: existing.pool_id };
}
