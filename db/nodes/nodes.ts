import { type RawBuilder, sql, type Transaction } from 'kysely';
import type { Database, Db } from '../../core/database.ts';
import { ComputeError } from '../../domain/errors.ts';
import {
  type Connectivity,
  endedAllocationStates,
  type NodeRole,
  type ProvisionState,
} from '../../domain/fleet.ts';
import { newId } from '../../domain/ids.ts';
import { canonicalJson, type DeviceAssignment, normalizeAssignments } from '../../domain/node-spec.ts';
import { preparedMarker } from '../pool.ts';
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
    .forNoKeyUpdate()
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

/** A node condition to set. */
export interface NodeConditionInput {
  type: string;
  reason: string;
  message: string;
  effect: 'NoSchedule' | null;
}

/** Conditions of one node to set, and condition types to clear. */
export interface NodeConditionChanges {
  set: readonly NodeConditionInput[];
  clear: readonly string[];
}

/**
 * The parts of a WITH list (`conditions_cleared`, `conditions_set`) that set and clear a node's
 * conditions, for a statement that writes them beside other rows. Idempotent; `since` is kept
 * while the reason stays. A type must not be both set and cleared.
 */
export function nodeConditionWrites(nodeId: string, changes: NodeConditionChanges): RawBuilder<unknown> {
  const { set } = changes;
  return sql`conditions_cleared AS (
      DELETE FROM node_conditions WHERE node_id = ${nodeId} AND type = ANY(${[...changes.clear]}::text[])
    ), conditions_set AS (
      INSERT INTO node_conditions (node_id, type, reason, message, effect)
      SELECT ${nodeId}, c.type, c.reason, c.message, c.effect
      FROM unnest(${set.map((c) => c.type)}::text[], ${set.map((c) => c.reason)}::text[],
                  ${set.map((c) => c.message)}::text[], ${set.map((c) => c.effect)}::text[])
        AS c(type, reason, message, effect)
      ON CONFLICT (node_id, type) DO UPDATE SET
        reason = EXCLUDED.reason, message = EXCLUDED.message, effect = EXCLUDED.effect,
        since = CASE WHEN node_conditions.reason = EXCLUDED.reason THEN node_conditions.since ELSE compute_now() END,
        updated_at = compute_now()
    )`;
}

/** Sets and clears conditions of a node in one statement (nodeConditionWrites). */
export async function setNodeConditions(
  db: Db | Trx,
  nodeId: string,
  changes: NodeConditionChanges,
): Promise<void> {
  await sql`${sql.raw(preparedMarker)} WITH ${nodeConditionWrites(nodeId, changes)} SELECT 1`.execute(db);
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
 * cleared again when the node is uncordoned; a finished drain, `drained_at`, is cleared with
 * `draining`). Idempotent; answers whether anything a caller
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
    .forNoKeyUpdate()
    .executeTakeFirst();
  if (!before) throw new ComputeError('NOT_FOUND', `node ${nodeId} not found`);
  await trx
    .updateTable('nodes')
    .set({
      cordoned,
      draining,
      cordon_reason: cordoned ? input.reason : null,
      // A finished drain stays finished while the node keeps draining; anything else clears it.
      ...(draining ? {} : { drained_at: null }),
      updated_at: sql<Date>`compute_now()`,
    })
    .where('id', '=', nodeId)
    .execute();
  if (draining) {
    await setNodeConditions(trx, nodeId, {
      set: [
        {
          type: 'Draining',
          reason: 'DrainRequested',
          message: input.reason ?? 'nodes.drain',
          effect: 'NoSchedule',
        },
      ],
      clear: [],
    });
  } else if (!cordoned) {
    await setNodeConditions(trx, nodeId, { set: [], clear: ['Draining'] });
  }
  const changed =
    before.cordoned !== cordoned || (draining && !before.draining) || (!cordoned && before.draining);
  return { changed };
}

/** A node found by its hardware key or a reclaim proof, as the join decides on it. */
export interface JoinClaimedNode {
  id: string;
  name: string;
  siteId: string;
  poolId: string | null;
  provisionState: ProvisionState;
  hardwareKey: string | null;
  /** An operator's nodes.approveReclaim is in force (by compute_now()). */
  reclaimApproved: boolean;
}

/**
 * The node holding `hardwareKey` (`by: 'hardwareKey'`) or with id `nodeId` (`by: 'id'`), under its
 * row lock in the caller's transaction, or null. Read and lock only.
 */
export async function lockJoinClaimedNode(
  trx: Trx,
  lookup: { by: 'hardwareKey'; hardwareKey: string } | { by: 'id'; nodeId: string },
): Promise<JoinClaimedNode | null> {
  const query = trx
    .selectFrom('nodes')
    .select([
      'id',
      'name',
      'site_id',
      'pool_id',
      'provision_state',
      'hardware_key',
      sql<boolean>`coalesce(reclaim_approved_until > compute_now(), false)`.as('reclaim_approved'),
    ]);
  const row = await (lookup.by === 'id'
    ? query.where('id', '=', lookup.nodeId)
    : query.where('hardware_key', '=', lookup.hardwareKey)
  )
    .forNoKeyUpdate()
    .executeTakeFirst();
  if (!row) return null;
  return {
    id: row.id,
    name: row.name,
    siteId: row.site_id,
    poolId: row.pool_id,
    provisionState: row.provision_state,
    hardwareKey: row.hardware_key,
    reclaimApproved: row.reclaim_approved,
  };
}

/** A node certificate already issued for a key, with its node: what a repeated Join answers. */
export interface JoinedWithKey {
  nodeId: string;
  nodeName: string;
  siteId: string;
  poolId: string;
  provisionState: string;
  spiffeId: string;
  certificatePem: string;
  notAfter: Date;
  /** Whether the node held certificates for another key before (it was reclaimed by this one). */
  reclaimed: boolean;
}

/**
 * The second statement of a Join, after `beginJoin`'s key lock (so it sees whatever an earlier
 * Join of that key committed), in one round trip:
 * - `repeat`: the newest unrevoked, unexpired node certificate (role `node`) issued for the key
 *   `keyId`, with its node. A Join whose CSR carries a key that already has one is the same
 *   machine asking again (its first reply was lost): the CSR's signature proves it holds the key.
 * - `holder`: the node holding `hardwareKey`, under its row lock (as `lockJoinClaimedNode`).
 */
export async function lockJoinCandidates(
  trx: Trx,
  input: { keyId: string; hardwareKey: string | null },
): Promise<{ repeat: JoinedWithKey | null; holder: JoinClaimedNode | null }> {
  const { rows } = await sql<{
    repeat: {
      node_id: string;
      name: string;
      site_id: string;
      pool_id: string;
      provision_state: string;
      spiffe_id: string;
      certificate_pem: string;
      not_after_ms: number;
      reclaimed: boolean;
    } | null;
    holder: {
      id: string;
      name: string;
      site_id: string;
      pool_id: string | null;
      provision_state: ProvisionState;
      hardware_key: string | null;
      reclaim_approved: boolean;
    } | null;
  }>`${sql.raw(preparedMarker)}
    WITH repeat AS (
      SELECT c.node_id, n.name, n.site_id, n.pool_id, n.provision_state, c.spiffe_id, c.certificate_pem,
        (extract(epoch FROM c.not_after) * 1000)::float8 AS not_after_ms,
        EXISTS (SELECT 1 FROM node_certificates o WHERE o.node_id = c.node_id AND o.key_id <> c.key_id) AS reclaimed
      FROM node_certificates c JOIN nodes n ON n.id = c.node_id
      WHERE c.key_id = ${input.keyId} AND c.role = 'node' AND c.revoked_at IS NULL
        AND c.not_after > compute_now()
      ORDER BY c.not_after DESC
      LIMIT 1
    ), holder AS (
      SELECT id, name, site_id, pool_id, provision_state, hardware_key,
        coalesce(reclaim_approved_until > compute_now(), false) AS reclaim_approved
      FROM nodes WHERE hardware_key = ${input.hardwareKey}
      FOR NO KEY UPDATE
    )
    SELECT (SELECT row_to_json(repeat) FROM repeat) AS repeat,
      (SELECT row_to_json(holder) FROM holder LIMIT 1) AS holder`.execute(trx);
  const { repeat, holder } = rows[0]!;
  return {
    repeat: repeat && {
      nodeId: repeat.node_id,
      nodeName: repeat.name,
      siteId: repeat.site_id,
      poolId: repeat.pool_id,
      provisionState: repeat.provision_state,
      spiffeId: repeat.spiffe_id,
      certificatePem: repeat.certificate_pem,
      notAfter: new Date(repeat.not_after_ms),
      reclaimed: repeat.reclaimed,
    },
    holder: holder && {
      id: holder.id,
      name: holder.name,
      siteId: holder.site_id,
      poolId: holder.pool_id,
      provisionState: holder.provision_state,
      hardwareKey: holder.hardware_key,
      reclaimApproved: holder.reclaim_approved,
    },
  };
}

/** A retired node gives up its hardware key, so the machine may join again as a new node. */
export async function releaseHardwareKey(trx: Trx, nodeId: string): Promise<void> {
  await trx.updateTable('nodes').set({ hardware_key: null }).where('id', '=', nodeId).execute();
}

/**
 * Hands a node to the machine that joined as it, in the caller's transaction (the node locked by
 * `lockJoinClaimedNode`): revokes its certificates with `reason` (`superseded` after a proof of
 * its key, `reclaimed` after an operator's approval), uses up the approval, and records
 * `hardwareKey` when given (the caller checked no other node holds it). Idempotent.
 */
export async function reclaimJoinedNode(
  trx: Trx,
  input: { nodeId: string; reason: 'superseded' | 'reclaimed'; hardwareKey?: string },
): Promise<void> {
  await revokeNodeCertificates(trx, input.nodeId, { reason: input.reason });
  await trx
    .updateTable('nodes')
    .set({
      reclaim_approved_until: null,
      // A bare machine's node reclaimed by its deployed bcd leaves the ramdisk role.
      role: sql<NodeRole>`CASE WHEN role = 'ramdisk' THEN 'node' ELSE role END`,
      ...(input.hardwareKey ? { hardware_key: input.hardwareKey } : {}),
      updated_at: sql<Date>`compute_now()`,
    })
    .where('id', '=', input.nodeId)
    .execute();
}

export const hardwareKeyConflictType = 'HardwareKeyConflict';

/**
 * Marks a node that joined with the hardware key `other` holds and could not reclaim it: the
 * `HardwareKeyConflict` NoSchedule condition naming the other node (the same GPUs may be booked
 * there), for an operator to resolve with nodes.retire or nodes.approveReclaim. Idempotent.
 */
export async function markHardwareKeyConflict(
  trx: Trx,
  nodeId: string,
  other: { id: string; name: string },
): Promise<void> {
  await setNodeConditions(trx, nodeId, {
    set: [
      {
        type: hardwareKeyConflictType,
        reason: 'HardwareKeyInUse',
        message: `${conflictPrefix(other.id)}(${other.name}): retire one of them, or approve a reclaim (nodes.approveReclaim) and join again`,
        effect: 'NoSchedule',
      },
    ],
    clear: [],
  });
}

const conflictPrefix = (nodeId: string) => `the machine's hardware identifiers match node ${nodeId} `;

/**
 * Retires a node in the caller's transaction, under its row lock: provision state `retired`,
 * cordoned with `reason`, its hardware key released (the machine may join again as a new node),
 * any reclaim approval cleared, every certificate revoked (`retired`), its epoch incremented (its
 * session's writes are fenced; the gateway ends the session at its next certificate check) and
 * the `HardwareKeyConflict` conditions naming it cleared from other nodes. Refuses with
 * INVALID_STATE while live allocations hold it, unless `force` (they are not released: their
 * lifecycles find the node gone). Idempotent: a retired node answers `changed: false`. NOT_FOUND
 * for an unknown node.
 */
export async function retireNode(
  trx: Trx,
  input: { nodeId: string; force: boolean; reason: string | null },
): Promise<{ changed: boolean; revokedCertificates: number; liveAllocations: number }> {
  const node = await trx
    .selectFrom('nodes')
    .select(['provision_state'])
    .where('id', '=', input.nodeId)
    .forNoKeyUpdate()
    .executeTakeFirst();
  if (!node) throw new ComputeError('NOT_FOUND', `node ${input.nodeId} not found`);
  const live = await trx
    .selectFrom('allocations')
    .select((eb) => eb.fn.countAll<string>().as('n'))
    .where('node_id', '=', input.nodeId)
    .where('state', 'not in', endedAllocationStates)
    .executeTakeFirstOrThrow();
  const liveAllocations = Number(live.n);
  if (node.provision_state === 'retired') return { changed: false, revokedCertificates: 0, liveAllocations };
  if (liveAllocations > 0 && !input.force) {
    throw new ComputeError(
      'INVALID_STATE',
      `node ${input.nodeId} holds ${liveAllocations} live allocation(s): drain it first, or retire it with force`,
      { liveAllocations },
    );
  }
  const revokedCertificates = await revokeNodeCertificates(trx, input.nodeId, { reason: 'retired' });
  await trx
    .updateTable('nodes')
    .set({
      provision_state: 'retired',
      cordoned: true,
      cordon_reason: input.reason ?? 'retired',
      hardware_key: null,
      reclaim_approved_until: null,
      epoch: sql<string>`epoch + 1`,
      session_gateway: null,
      updated_at: sql<Date>`compute_now()`,
    })
    .where('id', '=', input.nodeId)
    .execute();
  await trx
    .deleteFrom('node_conditions')
    .where('type', '=', hardwareKeyConflictType)
    .where(sql<boolean>`starts_with(message, ${conflictPrefix(input.nodeId)})`)
    .execute();
  return { changed: true, revokedCertificates, liveAllocations };
}

/**
 * Lets the next join of the machine that holds this node's hardware key, with a token of the
 * node's pool, reclaim it without a reclaim proof (its key was lost), for `ttlSeconds` from
 * compute_now(); used once. INVALID_STATE for a retired node, NOT_FOUND for an unknown one.
 * Answers until when.
 */
export async function approveNodeReclaim(trx: Trx, nodeId: string, ttlSeconds: number): Promise<Date> {
  const node = await trx
    .selectFrom('nodes')
    .select(['provision_state', 'hardware_key'])
    .where('id', '=', nodeId)
    .forNoKeyUpdate()
    .executeTakeFirst();
  if (!node) throw new ComputeError('NOT_FOUND', `node ${nodeId} not found`);
  if (node.provision_state === 'retired') {
    throw new ComputeError('INVALID_STATE', `node ${nodeId} is retired`);
  }
  if (!node.hardware_key) {
    throw new ComputeError(
      'INVALID_STATE',
      `node ${nodeId} has no hardware key (its machine's identifiers were too weak, or another node holds them): it can only be reclaimed with proof of its key`,
    );
  }
  const row = await trx
    .updateTable('nodes')
    .set({
      reclaim_approved_until: sql<Date>`compute_now() + make_interval(secs => ${ttlSeconds})`,
      updated_at: sql<Date>`compute_now()`,
    })
    .where('id', '=', nodeId)
    .returning('reclaim_approved_until')
    .executeTakeFirstOrThrow();
  return row.reclaim_approved_until!;
}
