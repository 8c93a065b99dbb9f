import { createHash } from 'node:crypto';
import { WorkflowExecutionAlreadyStartedError } from '@temporalio/client';
import { z } from 'zod';
import { insertAuditEvent } from '../db/events/audit.ts';
import { insertOutboxEvent } from '../db/events/outbox.ts';
import { requireRelease } from '../db/releases/releases.ts';
import { insertRollout, listRollouts, type RolloutRow, requireRollout } from '../db/rollouts/rollouts.ts';
import { rolloutProgress } from '../db/rollouts/view.ts';
import { ComputeError } from '../domain/errors.ts';
import { canonicalJson } from '../domain/node-spec.ts';
import { defaultWaves } from '../domain/rollout-policy.ts';
import {
  rolloutNodeStates,
  rolloutStates,
  rolloutWorkflow,
  rolloutWorkflowStart,
} from '../domain/rollout-states.ts';
import { requireRootAdmin } from './admin/guard.ts';
import type { MethodContext } from './method.ts';
import { defineMethod } from './method.ts';

const rolloutId = z.string().regex(/^roll_[0-9a-z]{26}$/, 'a rollout id (roll_…)');

/** Cumulative percentages, increasing, the last 100 (checked by `checkWaves`). */
const wavesSchema = z.array(z.number().min(0.1).max(100)).min(1).max(20);

function checkWaves(waves: number[]): void {
  if (!waves.every((p, i) => i === 0 || p > waves[i - 1]!)) {
    throw new ComputeError(
      'INVALID_INPUT',
      'waves must increase (cumulative percentages such as 1, 10, 50, 100)',
      { field: 'waves' },
    );
  }
  if (waves.at(-1) !== 100) {
    throw new ComputeError('INVALID_INPUT', 'the last wave must be 100 (every selected node)', {
      field: 'waves',
    });
  }
}

/** Pools and/or labels, at least one of them (a rollout never selects the whole fleet implicitly). */
const selectorSchema = z.strictObject({
  poolIds: z
    .array(z.string().regex(/^pool_[0-9a-z]{26}$/, 'a pool id (pool_…)'))
    .max(100)
    .optional(),
  labels: z.record(z.string().min(1).max(100), z.string().max(200)).optional(),
});

const waveOut = z.object({
  index: z.number().int(),
  percent: z.number(),
  nodes: z.number().int(),
  pending: z.number().int(),
  inProgress: z.number().int(),
  done: z.number().int(),
  failed: z.number().int(),
  skipped: z.number().int(),
  rolledBack: z.number().int(),
  failures: z.array(
    z.object({
      nodeId: z.string(),
      name: z.string(),
      reason: z.string().nullable(),
      rolledBack: z.boolean(),
      acknowledged: z.boolean(),
    }),
  ),
});

const rolloutOut = z.object({
  id: z.string(),
  releaseId: z.string(),
  version: z.string().nullable(),
  state: z.enum(rolloutStates),
  currentWave: z.number().int(),
  pauseReason: z.string().nullable(),
  abortMode: z.enum(['stop', 'rollback']).nullable(),
  rollback: z.enum(['rolling-back', 'rolled-back']).nullable(),
  selector: z.object({
    poolIds: z.array(z.string()).optional(),
    labels: z.record(z.string(), z.string()).optional(),
  }),
  waves: z.array(waveOut),
  budgets: z.array(
    z.object({
      poolId: z.string(),
      maxUpdating: z.number().int(),
      inUse: z.number().int(),
      soakSeconds: z.number(),
    }),
  ),
  nodes: z
    .array(
      z.object({
        nodeId: z.string(),
        name: z.string(),
        poolId: z.string(),
        wave: z.number().int(),
        state: z.enum(rolloutNodeStates),
        fromVersion: z.string().nullable(),
        agentVersion: z.string().nullable(),
        reason: z.string().nullable(),
      }),
    )
    .optional(),
  createdAt: z.number(),
  updatedAt: z.number(),
  finishedAt: z.number().nullable(),
});

type RolloutOut = z.input<typeof rolloutOut>;

async function view(ctx: MethodContext, rollout: RolloutRow, withNodes = false): Promise<RolloutOut> {
  const progress = await rolloutProgress(ctx.deps.db, rollout);
  return {
    id: rollout.id,
    releaseId: rollout.releaseId,
    version: progress.version,
    state: rollout.state,
    currentWave: rollout.currentWave,
    pauseReason: rollout.pauseReason,
    abortMode: rollout.abortMode,
    rollback:
      rollout.abortMode === 'rollback' ? (rollout.rollbackDone ? 'rolled-back' : 'rolling-back') : null,
    selector: rollout.selector as RolloutOut['selector'],
    waves: progress.waves,
    budgets: progress.budgets,
    ...(withNodes
      ? {
          nodes: progress.nodes.map((n) => ({
            nodeId: n.nodeId,
            name: n.nodeName,
            poolId: n.poolId,
            wave: n.wave,
            state: n.state,
            fromVersion: n.fromVersion,
            agentVersion: n.agentVersion,
            reason: n.reason,
          })),
        }
      : {}),
    createdAt: rollout.createdAt.getTime(),
    updatedAt: rollout.updatedAt.getTime(),
    finishedAt: rollout.finishedAt?.getTime() ?? null,
  };
}

function temporalOf(ctx: MethodContext) {
  const { temporal } = ctx.deps;
  if (!temporal) {
    throw new ComputeError(
      'UNAVAILABLE',
      'rollouts run as Temporal workflows and this server has no Temporal client: configure TEMPORAL_ADDRESS',
    );
  }
  return temporal;
}

/** Starts the rollout's workflow (id = rollout id); starting it again is harmless. */
async function startWorkflow(ctx: MethodContext, rollout: RolloutRow): Promise<void> {
  try {
    await temporalOf(ctx).workflow.start(
      rolloutWorkflow.type,
      rolloutWorkflowStart(rollout.id, ctx.deps.config.BETTER_COMPUTE_TASK_QUEUE),
    );
  } catch (error) {
    if (!(error instanceof WorkflowExecutionAlreadyStartedError)) throw error;
  }
}

const create = defineMethod({
  summary:
    'Roll a release out to the selected nodes (poolIds and/or labels) in waves (cumulative percentages, default 1, 10, 50, 100), within each pool’s disruption budget; pauses itself when a wave’s failures reach max(1 node, 5%). Idempotent by key.',
  action: 'compute:admin:write',
  input: z.strictObject({
    releaseId: z.string().regex(/^rel_[0-9a-z]{26}$/, 'a release id (rel_…)'),
    selector: selectorSchema,
    waves: wavesSchema.optional(),
    idempotencyKey: z
      .string()
      .regex(/^[A-Za-z0-9._:-]{1,100}$/, 'an idempotency key (1 to 100 of A-Z a-z 0-9 . _ : -)'),
  }),
  output: rolloutOut.extend({ created: z.boolean() }),
  handler: async (ctx, input) => {
    await requireRootAdmin(ctx, 'compute:admin:write');
    const release = await requireRelease(ctx.deps.db, input.releaseId);
    const waves = input.waves ?? [...defaultWaves];
    checkWaves(waves);
    if (
      (input.selector.poolIds?.length ?? 0) === 0 &&
      Object.keys(input.selector.labels ?? {}).length === 0
    ) {
      throw new ComputeError(
        'INVALID_INPUT',
        'selector: name poolIds or labels (a rollout never selects the whole fleet implicitly)',
        { field: 'selector' },
      );
    }
    const requestHash = createHash('sha256')
      .update(canonicalJson({ releaseId: input.releaseId, selector: input.selector, waves }))
      .digest('hex');
    const { rollout, created } = await insertRollout(ctx.deps.db, {
      releaseId: release.id,
      createdBy: ctx.principal.identityId,
      idempotencyKey: input.idempotencyKey,
      requestHash,
      selector: input.selector,
      waves,
    });
    if (created) {
      await ctx.deps.db.transaction().execute(async (trx) => {
        await insertOutboxEvent(trx, {
          type: 'rollout.created',
          subject: `rollout/${rollout.id}`,
          tenantId: null,
          data: { rolloutId: rollout.id, releaseId: release.id, version: release.version, waves },
        });
        await insertAuditEvent(trx, {
          tenantId: ctx.principal.tenantId,
          actorIdentityId: ctx.principal.identityId,
          action: 'compute:admin:write',
          resourceType: 'compute-rollout',
          resourceId: rollout.id,
          requestId: ctx.requestId,
          context: { releaseId: release.id, selector: input.selector, waves },
        });
      });
    }
    // A crash before this start leaves the rollout without its workflow: the same request again
    // (same key) starts it, and so does the orphan sweeper (sweepOrphanRollouts).
    if (rollout.state === 'running' || rollout.state === 'paused') await startWorkflow(ctx, rollout);
    return { ...(await view(ctx, rollout)), created };
  },
});

const get = defineMethod({
  summary:
    'One rollout: its state and, per wave, nodes done, in progress and failed; per pool, the budget in use.',
  action: 'compute:admin:read',
  input: z.strictObject({ rolloutId, nodes: z.boolean().default(false) }),
  output: rolloutOut,
  handler: async (ctx, input) => {
    await requireRootAdmin(ctx, 'compute:admin:read');
    return view(ctx, await requireRollout(ctx.deps.db, input.rolloutId), input.nodes);
  },
});

const list = defineMethod({
  summary: 'Rollouts, newest first (optionally in one state).',
  action: 'compute:admin:read',
  input: z.strictObject({
    state: z.enum(rolloutStates).optional(),
    limit: z.number().int().min(1).max(100).default(20),
  }),
  output: z.object({ rollouts: z.array(rolloutOut) }),
  handler: async (ctx, input) => {
    await requireRootAdmin(ctx, 'compute:admin:read');
    const rows = await listRollouts(ctx.deps.db, { limit: input.limit, state: input.state });
    return { rollouts: await Promise.all(rows.map((r) => view(ctx, r))) };
  },
});

/**
 * Signals the rollout's workflow and waits (at most 5 s) until PostgreSQL shows `reached`, so the
 * answer says what the signal did. INVALID_STATE when the rollout already ended.
 */
async function signal(
  ctx: MethodContext,
  id: string,
  name: string,
  args: unknown[],
  reached: (r: RolloutRow) => boolean,
): Promise<RolloutOut> {
  await requireRootAdmin(ctx, 'compute:admin:write');
  const before = await requireRollout(ctx.deps.db, id);
  const abortToRollback =
    name === rolloutWorkflow.signals.abort && before.state === 'aborted' && before.abortMode === 'stop';
  if (
    (before.state === 'completed' || before.state === 'aborted') &&
    !(abortToRollback && (args[0] as { rollback?: boolean })?.rollback)
  ) {
    throw new ComputeError('INVALID_STATE', `rollout ${id} is ${before.state}: nothing to ${name}`);
  }
  await temporalOf(ctx)
    .workflow.getHandle(id)
    .signal(name, ...args);
  const deadline = Date.now() + 5_000; // wall time: a bounded wait on the workflow's step
  let now = before;
  // wall time: a bounded wait on the rollout
  while (!reached(now) && Date.now() < deadline && !ctx.signal.aborted) {
    await new Promise((r) => setTimeout(r, 100));
    now = await requireRollout(ctx.deps.db, id);
  }
  return view(ctx, now);
}

const pause = defineMethod({
  summary: 'Pause a rollout: no new node starts; nodes in their health gate finish it.',
  action: 'compute:admin:write',
  input: z.strictObject({ rolloutId, reason: z.string().max(500).optional() }),
  output: rolloutOut,
  handler: (ctx, input) =>
    signal(
      ctx,
      input.rolloutId,
      rolloutWorkflow.signals.pause,
      [{ ...(input.reason ? { reason: input.reason } : {}) }],
      (r) => r.state !== 'running',
    ),
});

const resume = defineMethod({
  summary:
    'Resume a paused rollout (the failures that paused it no longer count toward its wave’s threshold).',
  action: 'compute:admin:write',
  input: z.strictObject({ rolloutId }),
  output: rolloutOut,
  handler: async (ctx, input) => {
    const before = await requireRollout(ctx.deps.db, input.rolloutId);
    if (before.state === 'running')
      throw new ComputeError('INVALID_STATE', `rollout ${input.rolloutId} is running, not paused`);
    return signal(ctx, input.rolloutId, rolloutWorkflow.signals.resume, [], (r) => r.state !== 'paused');
  },
});

const abort = defineMethod({
  summary:
    'Abort a rollout: no new node starts and updated nodes stay as they are; with rollback, updated nodes go back to their previous version in reverse waves.',
  action: 'compute:admin:write',
  input: z.strictObject({ rolloutId, rollback: z.boolean().default(false) }),
  output: rolloutOut,
  handler: (ctx, input) =>
    signal(
      ctx,
      input.rolloutId,
      rolloutWorkflow.signals.abort,
      [{ rollback: input.rollback }],
      (r) => r.state === 'aborted' && (!input.rollback || r.abortMode === 'rollback'),
    ),
});

/** `rollouts.*`: signed releases rolled out in waves (root administrators only). */
export const rolloutMethods = { create, get, list, pause, resume, abort };
