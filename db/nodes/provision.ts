import { sql, type Transaction } from 'kysely';
import type { Database } from '../../core/database.ts';
import { ComputeError } from '../../domain/errors.ts';
import type { ProvisionState } from '../../domain/fleet.ts';
import { assertProvisionMove } from '../../domain/provision-states.ts';
import { insertOutboxEvent } from '../events/outbox.ts';

type Trx = Transaction<Database>;

/** A node's provisioning axes, read under its row lock. */
export interface NodeProvisioning {
  nodeId: string;
  poolId: string | null;
  siteId: string;
  provisionState: ProvisionState;
  maintenance: boolean;
  maintenanceReason: string | null;
}

/** Locks the node's row and reads its provisioning axes. NOT_FOUND for an unknown node. */
export async function lockNodeProvisioning(trx: Trx, nodeId: string): Promise<NodeProvisioning> {
  const row = await trx
    .selectFrom('nodes')
    .where('id', '=', nodeId)
    .select(['id', 'pool_id', 'site_id', 'provision_state', 'maintenance', 'maintenance_reason'])
    .forNoKeyUpdate()
    .executeTakeFirst();
  if (!row) throw new ComputeError('NOT_FOUND', `node ${nodeId} not found`);
  return {
    nodeId: row.id,
    poolId: row.pool_id,
    siteId: row.site_id,
    provisionState: row.provision_state,
    maintenance: row.maintenance,
    maintenanceReason: row.maintenance_reason,
  };
}

/**
 * Moves a node's provision state to `to` under its row lock, checked against the table of legal
 * moves (INVALID_STATE naming the current state otherwise), with a `node.provision-state-changed`
 * event in the same transaction. Idempotent: a node already in `to` answers `changed: false`.
 */
export async function moveProvisionState(
  trx: Trx,
  input: { nodeId: string; to: ProvisionState; verb: string; tenantId: string | null },
): Promise<{ changed: boolean; from: ProvisionState }> {
  const node = await lockNodeProvisioning(trx, input.nodeId);
  if (node.provisionState === input.to) return { changed: false, from: node.provisionState };
  assertProvisionMove(input.nodeId, node.provisionState, input.to, input.verb);
  await trx
    .updateTable('nodes')
    .set({ provision_state: input.to, updated_at: sql<Date>`compute_now()` })
    .where('id', '=', input.nodeId)
    .execute();
  await insertOutboxEvent(trx, {
    type: 'node.provision-state-changed',
    subject: `node/${input.nodeId}`,
    tenantId: input.tenantId,
    data: { nodeId: input.nodeId, from: node.provisionState, to: input.to, by: input.verb },
  });
  return { changed: true, from: node.provisionState };
}

/**
 * Puts a node in maintenance with `reason` (out of placement, whatever its provision state), or
 * replaces the reason, with a `node.maintenance-set` event. Idempotent for the same reason.
 */
export async function setNodeMaintenance(
  trx: Trx,
  input: { nodeId: string; reason: string; tenantId: string | null },
): Promise<{ changed: boolean }> {
  const node = await lockNodeProvisioning(trx, input.nodeId);
  if (node.maintenance && node.maintenanceReason === input.reason) return { changed: false };
  await trx
    .updateTable('nodes')
    .set({ maintenance: true, maintenance_reason: input.reason, updated_at: sql<Date>`compute_now()` })
    .where('id', '=', input.nodeId)
    .execute();
  await insertOutboxEvent(trx, {
    type: 'node.maintenance-set',
    subject: `node/${input.nodeId}`,
    tenantId: input.tenantId,
    data: { nodeId: input.nodeId, reason: input.reason, provisionState: node.provisionState },
  });
  return { changed: true };
}

/**
 * Takes a node out of maintenance, with a `node.maintenance-cleared` event. INVALID_STATE while a
 * provisioning workflow of the node is failed and waiting for `metal.retry` or `metal.abort` (its
 * machine is half-way: the workflow decides). Idempotent.
 */
export async function clearNodeMaintenance(
  trx: Trx,
  input: { nodeId: string; tenantId: string | null },
): Promise<{ changed: boolean }> {
  const node = await lockNodeProvisioning(trx, input.nodeId);
  if (!node.maintenance) return { changed: false };
  const waiting = await trx
    .selectFrom('metal_workflows')
    .where('node_id', '=', input.nodeId)
    .where('state', '=', 'failed')
    .select('id')
    .executeTakeFirst();
  if (waiting) {
    throw new ComputeError(
      'INVALID_STATE',
      `node ${input.nodeId} has the failed workflow ${waiting.id}: retry it (metal.retry) or abort it (metal.abort), which decides the machine's state`,
      { workflowId: waiting.id },
    );
  }
  await trx
    .updateTable('nodes')
    .set({ maintenance: false, maintenance_reason: null, updated_at: sql<Date>`compute_now()` })
    .where('id', '=', input.nodeId)
    .execute();
  await insertOutboxEvent(trx, {
    type: 'node.maintenance-cleared',
    subject: `node/${input.nodeId}`,
    tenantId: input.tenantId,
    data: { nodeId: input.nodeId, reason: node.maintenanceReason },
  });
  return { changed: true };
}
