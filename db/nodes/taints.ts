import { sql, type Transaction } from 'kysely';
import type { Database } from '../../core/database.ts';
import { insertOutboxEvent } from '../events/outbox.ts';
import { lockNodeProvisioning } from './provision.ts';

type Trx = Transaction<Database>;

/** The condition type an operator's taint is stored under: `Taint:<reason>`. */
export const taintConditionPrefix = 'Taint:';

/** The condition type of the taint named `reason`. */
export function taintConditionType(reason: string): string {
  return `${taintConditionPrefix}${reason}`;
}

/**
 * Taints a node with a named NoSchedule reason: a node condition `Taint:<reason>` (effect
 * NoSchedule) beside the controllers' own, which the placer's candidate query reads like any other
 * NoSchedule condition, so the node takes no new placements while it stands (what runs keeps
 * running). Under the node's row lock, with a `node.tainted` event. Idempotent: the same reason
 * twice answers `changed: false`. NOT_FOUND for an unknown node.
 */
export async function taintNode(
  trx: Trx,
  input: { nodeId: string; reason: string; tenantId: string | null; by: string },
): Promise<{ changed: boolean }> {
  await lockNodeProvisioning(trx, input.nodeId);
  const inserted = await sql<{ type: string }>`
    INSERT INTO node_conditions (node_id, type, reason, message, effect)
    VALUES (${input.nodeId}, ${taintConditionType(input.reason)}, 'OperatorTaint',
            ${`tainted by ${input.by}: ${input.reason}`}, 'NoSchedule')
    ON CONFLICT (node_id, type) DO NOTHING
    RETURNING type`.execute(trx);
  if (inserted.rows.length === 0) return { changed: false };
  await insertOutboxEvent(trx, {
    type: 'node.tainted',
    subject: `node/${input.nodeId}`,
    tenantId: input.tenantId,
    data: { nodeId: input.nodeId, reason: input.reason },
  });
  return { changed: true };
}

/**
 * Removes the taint named `reason` (the node takes placements again once nothing else stops it),
 * with a `node.untainted` event. Idempotent: an absent taint answers `changed: false`. NOT_FOUND
 * for an unknown node.
 */
export async function untaintNode(
  trx: Trx,
  input: { nodeId: string; reason: string; tenantId: string | null },
): Promise<{ changed: boolean }> {
  await lockNodeProvisioning(trx, input.nodeId);
  const removed = await trx
    .deleteFrom('node_conditions')
    .where('node_id', '=', input.nodeId)
    .where('type', '=', taintConditionType(input.reason))
    .returning('type')
    .execute();
  if (removed.length === 0) return { changed: false };
  await insertOutboxEvent(trx, {
    type: 'node.untainted',
    subject: `node/${input.nodeId}`,
    tenantId: input.tenantId,
    data: { nodeId: input.nodeId, reason: input.reason },
  });
  return { changed: true };
}
