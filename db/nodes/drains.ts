import { sql, type Transaction } from 'kysely';
import type { Database, Db } from '../../core/database.ts';
import { endedAllocationStates } from '../../domain/fleet.ts';
import { insertOutboxEvent } from '../events/outbox.ts';
import { literalList } from '../sql-literals.ts';

type Trx = Transaction<Database>;

/**
 * Finishes the drains that are over among `nodeIds`: a node that is draining, not drained yet,
 * and holds no allocation that has not ended (released or failed; a calendar booking moved off it
 * by BookingRepair is superseded and ended) becomes drained (`drained_at`), with a `node.drained`
 * event in the caller's transaction. Level-triggered and idempotent: call it wherever allocations
 * end, as often as wanted. The draining nodes' rows are locked in id order first and the live
 * allocations counted in a later statement, so of two transactions ending a node's last two
 * allocations at once the second always sees the first's and finishes the drain. Answers the
 * node ids it drained.
 */
export async function finishDrains(trx: Trx, nodeIds: readonly string[]): Promise<string[]> {
  if (nodeIds.length === 0) return [];
  const draining = await trx
    .selectFrom('nodes')
    .select('id')
    .where('id', 'in', [...new Set(nodeIds)])
    .where('draining', '=', true)
    .where('drained_at', 'is', null)
    .orderBy('id')
    .forNoKeyUpdate()
    .execute();
  if (draining.length === 0) return [];
  const { rows } = await sql<{
    id: string;
    pool_id: string | null;
    owner_tenant_id: string | null;
    reason: string | null;
  }>`
    UPDATE nodes n SET drained_at = compute_now(), updated_at = compute_now()
     WHERE n.id = ANY(${draining.map((d) => d.id)}::text[])
       AND NOT EXISTS (SELECT 1 FROM allocations a
                        WHERE a.node_id = n.id AND a.state NOT IN (${literalList(endedAllocationStates)}))
    RETURNING n.id, n.pool_id, n.cordon_reason AS reason,
              (SELECT p.owner_tenant_id FROM pools p WHERE p.id = n.pool_id) AS owner_tenant_id`.execute(trx);
  for (const row of [...rows].sort((a, b) => a.id.localeCompare(b.id))) {
    await insertOutboxEvent(trx, {
      type: 'node.drained',
      subject: `node/${row.id}`,
      tenantId: row.owner_tenant_id,
      data: { nodeId: row.id, poolId: row.pool_id, reason: row.reason },
    });
  }
  return rows.map((r) => r.id).sort();
}

/** Draining nodes whose drain has not finished (the sweeper's safety net), at most `limit`. */
export async function findUnfinishedDrains(db: Db, limit: number): Promise<string[]> {
  const rows = await db
    .selectFrom('nodes')
    .select('id')
    .where('draining', '=', true)
    .where('drained_at', 'is', null)
    .orderBy('id')
    .limit(limit)
    .execute();
  return rows.map((r) => r.id);
}
