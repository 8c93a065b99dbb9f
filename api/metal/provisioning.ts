import { WorkflowExecutionAlreadyStartedError } from '@temporalio/client';
import { z } from 'zod';
import { insertAuditEvent } from '../../db/events/audit.ts';
import { findImage, imageUsableBy } from '../../db/metal/images.ts';
import {
  findMetalWorkflow,
  findMetalWorkflowByKey,
  insertMetalWorkflow,
  listMetalWorkflowIds,
  type MetalWorkflowView,
  requestMetalAbort,
  retryMetalWorkflow,
} from '../../db/metal/workflows.ts';
import { lockNodeProvisioning } from '../../db/nodes/provision.ts';
import { ComputeError } from '../../domain/errors.ts';
import {
  metalWorkflowNames,
  metalWorkflowStates,
  planDeploy,
  planInspect,
} from '../../domain/metal-steps.ts';
import { defineMethod, type MethodContext } from '../method.ts';
import { operatorReason, requireNode, requireTenantRead } from '../nodes-access.ts';
import { requireProfile } from './profiles.ts';
import { workflowOut, workflowView } from './workflow-views.ts';

const nodeId = z.string().regex(/^node_[0-9a-z]{26}$/, 'a node id (node_…)');
const workflowId = z.string().regex(/^wf_[0-9a-z]{26}$/, 'a workflow id (wf_…)');
const idempotencyKey = z
  .string()
  .regex(/^[A-Za-z0-9._:-]{1,100}$/, 'an idempotency key (1 to 100 of A-Z a-z 0-9 . _ : -)');

function temporalOf(ctx: MethodContext) {
  const { temporal } = ctx.deps;
  if (!temporal) {
    throw new ComputeError(
      'UNAVAILABLE',
      'provisioning workflows run on Temporal and this server has no Temporal client: configure TEMPORAL_ADDRESS',
    );
  }
  return temporal;
}

/** Starts the Temporal workflow of a metal workflow (id = its id); starting it again is harmless. */
async function startTemporal(ctx: MethodContext, wf: MetalWorkflowView): Promise<void> {
  await startMetalTemporalWorkflow(ctx, wf.id);
}

/** The same by id (metal.enroll starts the inspection). */
export async function startMetalTemporalWorkflow(ctx: MethodContext, id: string): Promise<void> {
  try {
    await temporalOf(ctx).workflow.start(metalWorkflowNames.type, {
      workflowId: id,
      taskQueue: ctx.deps.config.BETTER_COMPUTE_TASK_QUEUE,
      args: [{ workflowId: id }],
    });
  } catch (error) {
    if (!(error instanceof WorkflowExecutionAlreadyStartedError)) throw error;
  }
}

/** A workflow the caller may see (its node's), or NOT_FOUND. */
async function requireWorkflow(
  ctx: MethodContext,
  id: string,
  action: 'compute:nodes:read' | 'compute:nodes:provision',
): Promise<MetalWorkflowView> {
  const wf = await findMetalWorkflow(ctx.deps.db, id);
  if (!wf) throw new ComputeError('NOT_FOUND', `workflow ${id} not found`);
  await requireNode(ctx, wf.nodeId, action).catch((error: unknown) => {
    if (error instanceof ComputeError && error.code === 'NOT_FOUND') {
      throw new ComputeError('NOT_FOUND', `workflow ${id} not found`);
    }
    throw error;
  });
  return wf;
}

/** Waits at most a few seconds for the workflow to act on what was asked (`reached`). */
async function settle(ctx: MethodContext, id: string, reached: (wf: MetalWorkflowView) => boolean) {
  const deadline = Date.now() + 5_000; // wall time: a bounded wait on the workflow's next round
  let wf = (await findMetalWorkflow(ctx.deps.db, id))!;
  // wall time: a bounded wait on the workflow
  while (!reached(wf) && Date.now() < deadline && !ctx.signal.aborted) {
    await new Promise((r) => setTimeout(r, 100));
    wf = (await findMetalWorkflow(ctx.deps.db, id))!;
  }
  return wf;
}

const deploy = defineMethod({
  summary:
    'Deploy a profile to a ready (or deployed) bare machine: a provisioning workflow on Temporal whose steps run through the site agent (Redfish) and the ramdisk. Answers the workflow (id, state, steps). One active workflow per node; idempotent by key.',
  action: 'compute:nodes:provision',
  input: z.strictObject({
    nodeId,
    profileId: z.string().regex(/^prof_[0-9a-z]{26}$/, 'a profile id (prof_…)'),
    profileVersion: z.number().int().min(1).optional(),
    idempotencyKey,
  }),
  output: workflowOut,
  handler: async (ctx, input) => {
    const scope = await requireNode(ctx, input.nodeId, 'compute:nodes:provision');
    const profile = await requireProfile(
      ctx,
      { profileId: input.profileId, version: input.profileVersion },
      'compute:profiles:read',
    );
    const image = await findImage(ctx.deps.db, profile.spec.imageId);
    if (!image || !imageUsableBy(image, scope.tenantId)) {
      throw new ComputeError(
        'INVALID_STATE',
        `profile ${profile.id}: its image ${profile.spec.imageId} is not usable here`,
      );
    }
    temporalOf(ctx);
    const { workflowId: id } = await ctx.deps.db.transaction().execute(async (trx) => {
      const node = await lockNodeProvisioning(trx, input.nodeId);
      if (node.maintenance) {
        const same = await findMetalWorkflowByKey(trx, input.nodeId, input.idempotencyKey);
        if (!same) {
          throw new ComputeError(
            'INVALID_STATE',
            `node ${input.nodeId} is in maintenance (${node.maintenanceReason}): clear it first (nodes.clearMaintenance)`,
          );
        }
      }
      const started = await insertMetalWorkflow(trx, {
        kind: 'deploy',
        nodeId: input.nodeId,
        tenantId: scope.tenantId,
        profileId: profile.id,
        profileVersion: profile.version,
        idempotencyKey: input.idempotencyKey,
        steps: planDeploy({
          ...(profile.spec.stepTimeoutSeconds ? { timeoutSeconds: profile.spec.stepTimeoutSeconds } : {}),
          maxAttempts: profile.spec.maxAttempts,
        }),
        verb: 'metal.deploy',
      });
      if (started.created) {
        await insertAuditEvent(trx, {
          tenantId: scope.tenantId,
          actorIdentityId: ctx.principal.identityId,
          action: 'compute:nodes:provision',
          resourceType: 'compute-node',
          resourceId: input.nodeId,
          requestId: ctx.requestId,
          context: { workflowId: started.workflowId, profileId: profile.id, profileVersion: profile.version },
        });
      }
      return started;
    });
    const wf = (await findMetalWorkflow(ctx.deps.db, id))!;
    await startTemporal(ctx, wf);
    return workflowView(wf);
  },
});

const inspect = defineMethod({
  summary:
    'Inspect an enrolled bare machine: boot the ramdisk over the site agent’s network boot (the discovery attestor), read its inventory (hardware key, GPUs), power it off; the node becomes ready. Answers the workflow.',
  action: 'compute:nodes:provision',
  input: z.strictObject({ nodeId, idempotencyKey }),
  output: workflowOut,
  handler: async (ctx, input) => {
    const scope = await requireNode(ctx, input.nodeId, 'compute:nodes:provision');
    temporalOf(ctx);
    const { workflowId: id } = await ctx.deps.db.transaction().execute((trx) =>
      insertMetalWorkflow(trx, {
        kind: 'inspect',
        nodeId: input.nodeId,
        tenantId: scope.tenantId,
        profileId: null,
        profileVersion: null,
        idempotencyKey: input.idempotencyKey,
        steps: planInspect({ maxAttempts: 3 }),
        verb: 'metal.inspect',
      }),
    );
    const wf = (await findMetalWorkflow(ctx.deps.db, id))!;
    await startTemporal(ctx, wf);
    return workflowView(wf);
  },
});

const abort = defineMethod({
  summary:
    'Abort a provisioning workflow at once, whatever it waits for (a command, a callback, a rejoin): its cleanup steps run and the node ends in maintenance with the reason. Answers the workflow once it acted (or after 5 s).',
  action: 'compute:nodes:provision',
  input: z.strictObject({ workflowId, reason: operatorReason }),
  output: workflowOut,
  handler: async (ctx, input) => {
    const wf = await requireWorkflow(ctx, input.workflowId, 'compute:nodes:provision');
    await ctx.deps.db.transaction().execute(async (trx) => {
      await requestMetalAbort(trx, wf.id, input.reason);
      await insertAuditEvent(trx, {
        tenantId: wf.tenantId,
        actorIdentityId: ctx.principal.identityId,
        action: 'compute:nodes:provision',
        resourceType: 'compute-node',
        resourceId: wf.nodeId,
        requestId: ctx.requestId,
        context: { workflowId: wf.id, abort: input.reason },
      });
    });
    await startTemporal(ctx, wf);
    await temporalOf(ctx).workflow.getHandle(wf.id).signal(metalWorkflowNames.wakeSignal);
    return workflowView(
      await settle(ctx, wf.id, (now) => now.phase === 'cleanup' || now.state !== 'running'),
    );
  },
});

const retry = defineMethod({
  summary:
    'Resume a failed provisioning workflow from its failed step (its earlier attempts stay in its history).',
  action: 'compute:nodes:provision',
  input: z.strictObject({ workflowId }),
  output: workflowOut,
  handler: async (ctx, input) => {
    const wf = await requireWorkflow(ctx, input.workflowId, 'compute:nodes:provision');
    await ctx.deps.db.transaction().execute((trx) => retryMetalWorkflow(trx, wf.id));
    await startTemporal(ctx, wf);
    await temporalOf(ctx).workflow.getHandle(wf.id).signal(metalWorkflowNames.wakeSignal);
    return workflowView((await findMetalWorkflow(ctx.deps.db, wf.id))!);
  },
});

/** `metal.deploy|inspect|abort|retry`. */
export const provisioningMethods = { deploy, inspect, abort, retry };

const get = defineMethod({
  summary:
    'A provisioning workflow with every step and its attempts (state running, succeeded, failed or aborted).',
  action: 'compute:nodes:read',
  input: z.strictObject({ workflowId }),
  output: workflowOut,
  handler: async (ctx, input) =>
    workflowView(await requireWorkflow(ctx, input.workflowId, 'compute:nodes:read')),
});

const list = defineMethod({
  summary: 'Provisioning workflows, newest first (a tenant: those of its nodes).',
  action: 'compute:nodes:read',
  input: z.strictObject({
    nodeId: nodeId.optional(),
    siteId: z.string().max(100).optional(),
    state: z.enum(metalWorkflowStates).optional(),
    limit: z.number().int().min(1).max(200).default(50),
  }),
  output: z.object({ workflows: z.array(workflowOut) }),
  handler: async (ctx, input) => {
    if (input.nodeId) await requireNode(ctx, input.nodeId, 'compute:nodes:read');
    else await requireTenantRead(ctx, 'compute:nodes:read');
    const ids = await listMetalWorkflowIds(ctx.deps.db, {
      ...(ctx.principal.rootAdmin ? {} : { tenantId: ctx.principal.tenantId }),
      ...(input.nodeId ? { nodeId: input.nodeId } : {}),
      ...(input.siteId ? { siteId: input.siteId } : {}),
      ...(input.state ? { state: input.state } : {}),
      limit: input.limit,
    });
    const workflows: MetalWorkflowView[] = [];
    for (const id of ids) {
      const wf = await findMetalWorkflow(ctx.deps.db, id);
      if (wf) workflows.push(wf);
    }
    return { workflows: workflows.map(workflowView) };
  },
});

/** `workflows.*`: the provisioning workflows' own API group. */
export const workflowMethods = { get, list };
