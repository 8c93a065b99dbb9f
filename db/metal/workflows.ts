import { type RawBuilder, sql, type Transaction } from 'kysely';
import type { Database, Db } from '../../core/database.ts';
import { ComputeError } from '../../domain/errors.ts';
import { newId } from '../../domain/ids.ts';
import type {
  MetalWorkflowKind,
  MetalWorkflowState,
  StepAction,
  StepAttempt,
  StepPlan,
  StepTarget,
} from '../../domain/metal-steps.ts';
import { workflowProvisionStates } from '../../domain/metal-steps.ts';
import { insertOutboxEvent } from '../events/outbox.ts';
import { lockNodeProvisioning, moveProvisionState } from '../nodes/provision.ts';

type Trx = Transaction<Database>;

/**
 * The id of the provisioning workflow running on a machine, or NULL, as an SQL expression over the
 * machine's node id (at most one runs per node, `metal_workflows_one_active`). A statement that
 * stores what such a workflow waits on (its step's command result, the machine's agent joining
 * again) returns it, so the workflow is woken at once instead of at its next look.
 */
export function runningMetalWorkflowOf(nodeId: RawBuilder<string>): RawBuilder<string | null> {
  return sql<
    string | null
  >`(SELECT w.id FROM metal_workflows w WHERE w.node_id = ${nodeId} AND w.state = 'running')`;
}

/** runningMetalWorkflowOf the machine of the command `c` being completed (a `bmc.*` command's, or its node's). */
export const commandMetalWorkflow = runningMetalWorkflowOf(
  sql`COALESCE(c.payload->>'machineNodeId', c.node_id)`,
);

export interface MetalStepView {
  idx: number;
  phase: 'main' | 'cleanup';
  name: string;
  target: StepTarget;
  action: StepAction;
  awaitRejoin: 'ramdisk' | 'node' | null;
  timeoutSeconds: number;
  maxAttempts: number;
  state: 'pending' | 'running' | 'succeeded' | 'failed' | 'skipped';
  attempts: StepAttempt[];
  error: string | null;
  startedAt: Date | null;
  finishedAt: Date | null;
}

export interface MetalWorkflowView {
  id: string;
  kind: MetalWorkflowKind;
  nodeId: string;
  siteId: string;
  tenantId: string;
  profileId: string | null;
  profileVersion: number | null;
  state: MetalWorkflowState;
  phase: 'main' | 'cleanup';
  reason: string | null;
  abortRequested: string | null;
  allocationId: string | null;
  createdAt: Date;
  updatedAt: Date;
  finishedAt: Date | null;
  steps: MetalStepView[];
}

/**
 * Starts a provisioning workflow for one machine in the caller's transaction: the workflow row,
 * its expanded steps, the node moved to the kind's state (checked against the table of legal
 * moves) and a `metal.workflow-started` event. One active workflow per node, enforced by the
 * database (a running or failed one): CONFLICT naming it. Idempotent by `idempotencyKey` per node:
 * the same key answers the workflow it started (`created: false`).
 */
export async function insertMetalWorkflow(
  trx: Trx,
  input: {
    kind: MetalWorkflowKind;
    nodeId: string;
    tenantId: string;
    profileId: string | null;
    profileVersion: number | null;
    idempotencyKey: string | null;
    allocationId?: string | null;
    steps: StepPlan[];
    verb: string;
  },
): Promise<{ workflowId: string; created: boolean }> {
  const node = await lockNodeProvisioning(trx, input.nodeId);
  if (input.idempotencyKey) {
    const same = await trx
      .selectFrom('metal_workflows')
      .where('node_id', '=', input.nodeId)
      .where('idempotency_key', '=', input.idempotencyKey)
      .select('id')
      .executeTakeFirst();
    if (same) return { workflowId: same.id, created: false };
  }
  const active = await trx
    .selectFrom('metal_workflows')
    .where('node_id', '=', input.nodeId)
    .where('state', 'in', ['running', 'failed'])
    .select(['id', 'kind', 'state'])
    .executeTakeFirst();
  if (active) {
    throw new ComputeError(
      'CONFLICT',
      `node ${input.nodeId} already runs the ${active.kind} workflow ${active.id} (${active.state}): a node runs one provisioning workflow at a time; abort or retry it first`,
      { workflowId: active.id },
    );
  }
  await moveProvisionState(trx, {
    nodeId: input.nodeId,
    to: workflowProvisionStates[input.kind].during,
    verb: input.verb,
    tenantId: input.tenantId,
  });
  const id = newId('wf');
  await trx
    .insertInto('metal_workflows')
    .values({
      id,
      kind: input.kind,
      node_id: input.nodeId,
      site_id: node.siteId,
      tenant_id: input.tenantId,
      profile_id: input.profileId,
      profile_version: input.profileVersion,
      state: 'running',
      idempotency_key: input.idempotencyKey,
      allocation_id: input.allocationId ?? null,
    })
    .execute();
  await trx
    .insertInto('metal_workflow_steps')
    .values(
      input.steps.map((step, idx) => ({
        workflow_id: id,
        idx,
        phase: step.phase,
        name: step.name,
        target: step.target,
        action: JSON.stringify({
          ...step.action,
          ...(step.awaitRejoin ? { awaitRejoin: step.awaitRejoin } : {}),
        }),
        await_rejoin: step.awaitRejoin !== undefined,
        timeout_seconds: step.timeoutSeconds,
        max_attempts: step.maxAttempts,
      })),
    )
    .execute();
  await insertOutboxEvent(trx, {
    type: 'metal.workflow-started',
    subject: `node/${input.nodeId}`,
    tenantId: input.tenantId,
    data: { workflowId: id, kind: input.kind, nodeId: input.nodeId, profileId: input.profileId },
  });
  return { workflowId: id, created: true };
}

function stepView(row: {
  idx: number;
  phase: 'main' | 'cleanup';
  name: string;
  target: StepTarget;
  action: Record<string, unknown>;
  await_rejoin: boolean;
  timeout_seconds: number;
  max_attempts: number;
  state: MetalStepView['state'];
  attempts: Array<Record<string, unknown>>;
  error: string | null;
  started_at: Date | null;
  finished_at: Date | null;
}): MetalStepView {
  const action = row.action as StepAction & { awaitRejoin?: 'ramdisk' | 'node' };
  return {
    idx: row.idx,
    phase: row.phase,
    name: row.name,
    target: row.target,
    action,
    awaitRejoin: row.await_rejoin ? (action.awaitRejoin ?? 'node') : null,
    timeoutSeconds: row.timeout_seconds,
    maxAttempts: row.max_attempts,
    state: row.state,
    attempts: row.attempts as unknown as StepAttempt[],
    error: row.error,
    startedAt: row.started_at,
    finishedAt: row.finished_at,
  };
}

/** The id of the node's workflow started with this idempotency key, or null. */
export async function findMetalWorkflowByKey(
  db: Db | Trx,
  nodeId: string,
  idempotencyKey: string,
): Promise<string | null> {
  const row = await db
    .selectFrom('metal_workflows')
    .where('node_id', '=', nodeId)
    .where('idempotency_key', '=', idempotencyKey)
    .select('id')
    .executeTakeFirst();
  return row?.id ?? null;
}

/** One workflow with its steps (in order), or null. */
export async function findMetalWorkflow(db: Db | Trx, workflowId: string): Promise<MetalWorkflowView | null> {
  const row = await db
    .selectFrom('metal_workflows')
    .selectAll()
    .where('id', '=', workflowId)
    .executeTakeFirst();
  if (!row) return null;
  const steps = await db
    .selectFrom('metal_workflow_steps')
    .selectAll()
    .where('workflow_id', '=', workflowId)
    .orderBy('idx')
    .execute();
  return {
    id: row.id,
    kind: row.kind,
    nodeId: row.node_id,
    siteId: row.site_id,
    tenantId: row.tenant_id,
    profileId: row.profile_id,
    profileVersion: row.profile_version,
    state: row.state,
    phase: row.phase,
    reason: row.reason,
    abortRequested: row.abort_requested,
    allocationId: row.allocation_id,
    createdAt: row.created_at,
    updatedAt: row.updated_at,
    finishedAt: row.finished_at,
    steps: steps.map(stepView),
  };
}

/** Workflow ids, newest first, filtered. */
export async function listMetalWorkflowIds(
  db: Db,
  filter: { tenantId?: string; nodeId?: string; siteId?: string; state?: MetalWorkflowState; limit: number },
): Promise<string[]> {
  let query = db.selectFrom('metal_workflows').select('id').orderBy('id', 'desc').limit(filter.limit);
  if (filter.tenantId) query = query.where('tenant_id', '=', filter.tenantId);
  if (filter.nodeId) query = query.where('node_id', '=', filter.nodeId);
  if (filter.siteId) query = query.where('site_id', '=', filter.siteId);
  if (filter.state) query = query.where('state', '=', filter.state);
  return (await query.execute()).map((r) => r.id);
}

/**
 * Records an abort request (the workflow acts on it at its next step, which the signal wakes at
 * once). INVALID_STATE for a workflow already over. Idempotent: the first reason stays.
 */
export async function requestMetalAbort(
  trx: Trx,
  workflowId: string,
  reason: string,
): Promise<MetalWorkflowState> {
  const row = await trx
    .selectFrom('metal_workflows')
    .where('id', '=', workflowId)
    .select(['state', 'phase'])
    .forUpdate()
    .executeTakeFirst();
  if (!row) throw new ComputeError('NOT_FOUND', `workflow ${workflowId} not found`);
  if (row.state === 'succeeded' || row.state === 'aborted') {
    throw new ComputeError(
      'INVALID_STATE',
      `workflow ${workflowId} is ${row.state}: there is nothing to abort`,
    );
  }
  await trx
    .updateTable('metal_workflows')
    .set({
      abort_requested: sql<string>`COALESCE(abort_requested, ${reason})`,
      updated_at: sql<Date>`compute_now()`,
    })
    .where('id', '=', workflowId)
    .execute();
  return row.state;
}

/**
 * Resumes a failed workflow from its failed step: the step back to pending (its attempts kept,
 * the next one numbered after them), the workflow running, a `metal.workflow-retried` event.
 * INVALID_STATE unless the workflow is failed.
 */
export async function retryMetalWorkflow(trx: Trx, workflowId: string): Promise<void> {
  const row = await trx
    .selectFrom('metal_workflows')
    .where('id', '=', workflowId)
    .select(['state', 'node_id', 'tenant_id'])
    .forUpdate()
    .executeTakeFirst();
  if (!row) throw new ComputeError('NOT_FOUND', `workflow ${workflowId} not found`);
  if (row.state !== 'failed') {
    throw new ComputeError(
      'INVALID_STATE',
      `workflow ${workflowId} is ${row.state}: only a failed workflow can be retried`,
    );
  }
  const failed = await trx
    .updateTable('metal_workflow_steps')
    .set({ state: 'pending', error: null, finished_at: null })
    .where('workflow_id', '=', workflowId)
    .where('state', '=', 'failed')
    .returning('name')
    .execute();
  await trx
    .updateTable('metal_workflows')
    .set({ state: 'running', reason: null, updated_at: sql<Date>`compute_now()` })
    .where('id', '=', workflowId)
    .execute();
  await insertOutboxEvent(trx, {
    type: 'metal.workflow-retried',
    subject: `node/${row.node_id}`,
    tenantId: row.tenant_id,
    data: { workflowId, nodeId: row.node_id, steps: failed.map((s) => s.name) },
  });
}
