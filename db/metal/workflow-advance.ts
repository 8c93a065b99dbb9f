import { sql, type Transaction } from 'kysely';
import type { Database, Db } from '../../core/database.ts';
import { ComputeError, isComputeError } from '../../domain/errors.ts';
import type { ProfileSpec } from '../../domain/metal-profiles.ts';
import {
  judgeAttempt,
  type MetalWorkflowState,
  type StepAttempt,
  workflowProvisionStates,
} from '../../domain/metal-steps.ts';
import { readComputeNow } from '../clock.ts';
import { insertOutboxEvent } from '../events/outbox.ts';
import { enqueueNodeCommand, findNodeCommand } from '../nodes/commands.ts';
import { moveProvisionState, setNodeMaintenance } from '../nodes/provision.ts';
import { enqueueBmcCommand } from './bmc.ts';
import { freeCleanedMachine, leaseOfWorkflow } from './dedicated-leases.ts';
import { mintDiscoveryToken } from './discovery-tokens.ts';
import { findImage, imageUsableBy } from './images.ts';
import { findProfile, markProfileUsed } from './profiles.ts';
import { findMetalWorkflow, type MetalStepView, type MetalWorkflowView } from './workflows.ts';

type Trx = Transaction<Database>;

export interface MetalAdvanceOutcome {
  state: MetalWorkflowState;
  phase: 'main' | 'cleanup';
  /** The step the workflow is at (null when over). */
  step: string | null;
  finished: boolean;
  /** Waiting for an operator (failed: metal.retry or metal.abort). */
  waitsForOperator: boolean;
  nodeId: string;
  siteId: string;
  profileId: string | null;
  /** The dedicated-root lease the workflow deploys or wipes a machine for (its lifecycle is woken). */
  reservationId?: string;
}

const discoveryTtlSeconds = 3_600;

/** A marker of the maintenance reasons a workflow sets, so its success clears only its own. */
const reasonOf = (workflowId: string, text: string) => `workflow ${workflowId}: ${text}`.slice(0, 500);

/**
 * One step of a provisioning workflow, level-triggered, in one transaction under the workflow's
 * row lock: reads the workflow, its steps, the node and the current attempt's command; acts on an
 * abort request first (the current attempt is abandoned and its command cancelled if not yet
 * run, the remaining steps skipped, the cleanup steps run); judges the running attempt (command
 * outcome, rejoin, timeout); starts the next attempt or step (a control-plane step runs inline,
 * an agent step queues exactly one command, recorded with the attempt in the same transaction,
 * so a retried activity never queues it twice); and on the last step moves the node on. A step
 * out of attempts fails the workflow: the node goes to maintenance with the step and the error.
 * Idempotent: called again it re-reads and does only what is left.
 */
export async function advanceMetalWorkflow(db: Db, workflowId: string): Promise<MetalAdvanceOutcome> {
  return db.transaction().execute(async (trx) => {
    await trx.selectFrom('metal_workflows').where('id', '=', workflowId).select('id').forUpdate().execute();
    const lease = await leaseOfWorkflow(trx, workflowId);
    for (let round = 0; round < 32; round++) {
      const wf = await findMetalWorkflow(trx, workflowId);
      if (!wf) throw new ComputeError('NOT_FOUND', `workflow ${workflowId} not found`);
      const outcome = (
        finished: boolean,
        waitsForOperator: boolean,
        step: string | null,
      ): MetalAdvanceOutcome => ({
        state: wf.state,
        phase: wf.phase,
        step,
        finished,
        waitsForOperator,
        nodeId: wf.nodeId,
        siteId: wf.siteId,
        profileId: wf.profileId,
        ...(lease ? { reservationId: lease } : {}),
      });
      if (wf.state === 'succeeded' || wf.state === 'aborted') return outcome(true, false, null);
      if (wf.abortRequested && wf.phase === 'main') {
        await beginCleanup(trx, wf);
        continue;
      }
      if (wf.abortRequested && wf.state === 'failed') {
        // The cleanup itself failed and the operator gives up: over, the node stays where the
        // cleanup left it, in maintenance with the reason.
        await finish(trx, wf, 'aborted', { moveNode: false });
        continue;
      }
      if (wf.state === 'failed')
        return outcome(false, true, wf.steps.find((s) => s.state === 'failed')?.name ?? null);
      const step = wf.steps.find(
        (s) => s.phase === wf.phase && (s.state === 'pending' || s.state === 'running'),
      );
      if (!step) {
        await finish(trx, wf, wf.phase === 'main' ? 'succeeded' : 'aborted', { moveNode: true });
        continue;
      }
      const acted = await advanceStep(trx, wf, step);
      if (!acted) return outcome(false, false, step.name);
    }
    const wf = (await findMetalWorkflow(trx, workflowId))!;
    return {
      state: wf.state,
      phase: wf.phase,
      step: null,
      finished: wf.state === 'succeeded' || wf.state === 'aborted',
      waitsForOperator: wf.state === 'failed',
      nodeId: wf.nodeId,
      siteId: wf.siteId,
      profileId: wf.profileId,
      ...(lease ? { reservationId: lease } : {}),
    };
  });
}

async function nodeNow(trx: Trx, nodeId: string) {
  const row = await trx
    .selectFrom('nodes')
    .where('id', '=', nodeId)
    .select(['role', 'connectivity', 'epoch'])
    .executeTakeFirstOrThrow();
  return { role: row.role as string, connectivity: row.connectivity as string, epoch: Number(row.epoch) };
}

async function saveStep(
  trx: Trx,
  wf: MetalWorkflowView,
  step: MetalStepView,
  change: { state: MetalStepView['state']; attempts: StepAttempt[]; error?: string | null },
): Promise<void> {
  await trx
    .updateTable('metal_workflow_steps')
    .set({
      state: change.state,
      attempts: JSON.stringify(change.attempts),
      error: change.error ?? null,
      started_at: sql<Date>`COALESCE(started_at, compute_now())`,
      finished_at:
        change.state === 'succeeded' || change.state === 'failed' || change.state === 'skipped'
          ? sql<Date>`compute_now()`
          : null,
    })
    .where('workflow_id', '=', wf.id)
    .where('idx', '=', step.idx)
    .execute();
  await trx
    .updateTable('metal_workflows')
    .set({ updated_at: sql<Date>`compute_now()` })
    .where('id', '=', wf.id)
    .execute();
  if (change.state === 'succeeded' || change.state === 'failed') {
    await insertOutboxEvent(trx, {
      type: 'metal.workflow-step-finished',
      subject: `node/${wf.nodeId}`,
      tenantId: wf.tenantId,
      data: {
        workflowId: wf.id,
        nodeId: wf.nodeId,
        step: step.name,
        state: change.state,
        attempts: change.attempts.length,
        error: change.error ?? null,
      },
    });
  }
}

/** Acts on one step; answers false when it waits (nothing more to do in this round). */
async function advanceStep(trx: Trx, wf: MetalWorkflowView, step: MetalStepView): Promise<boolean> {
  const nowMs = (await readComputeNow(trx)).getTime();
  const node = await nodeNow(trx, wf.nodeId);
  const attempts = [...step.attempts];
  const current = attempts.at(-1);
  if (step.state === 'running' && current?.state === 'running') {
    const command = current.commandId ? await findNodeCommand(trx, current.commandId) : null;
    const verdict = judgeAttempt(step, current, {
      command: command ? { state: command.state, error: command.error, result: command.result } : null,
      node,
      nowMs,
    });
    if (verdict.kind === 'wait') return false;
    attempts[attempts.length - 1] = {
      ...current,
      state: verdict.kind,
      error: verdict.kind === 'failed' ? verdict.error : null,
      finishedAt: nowMs,
    };
    if (verdict.kind === 'succeeded') {
      await saveStep(trx, wf, step, { state: 'succeeded', attempts });
      return true;
    }
    if (current.commandId && command && (command.state === 'queued' || command.state === 'delivered')) {
      await cancelCommand(trx, current.commandId, verdict.error);
    }
    await failAttempt(trx, wf, step, attempts, verdict.error);
    return true;
  }
  // Start the next attempt.
  const n = (attempts.at(-1)?.n ?? 0) + 1;
  const attempt: StepAttempt = {
    n,
    commandId: null,
    state: 'running',
    error: null,
    // A join since the step began counts for a retry too: a failed attempt's power change may
    // still have been applied (a BMC that answered too late), and its agent is up already.
    epochBefore: step.awaitRejoin && attempts[0] ? attempts[0].epochBefore : node.epoch,
    startedAt: nowMs,
    finishedAt: null,
  };
  try {
    if (step.target === 'control-plane') {
      await runControlPlaneStep(trx, wf, step);
      attempts.push({ ...attempt, state: 'succeeded', finishedAt: nowMs });
      await saveStep(trx, wf, step, { state: 'succeeded', attempts });
      return true;
    }
    attempt.commandId = await queueStepCommand(trx, wf, step, node.role);
    attempts.push(attempt);
    await saveStep(trx, wf, step, { state: 'running', attempts });
    return true;
  } catch (error) {
    if (!isComputeError(error) || error.code === 'INTERNAL') throw error;
    // No site agent holds the boot lease just now (a failover under way, a restart): the step
    // waits for one within its timeout instead of spending every attempt in the gap at once.
    const waitingSince = step.attempts.at(-1)?.finishedAt ?? step.startedAt?.getTime() ?? nowMs;
    if (error.code === 'UNAVAILABLE' && nowMs - waitingSince < step.timeoutSeconds * 1_000) {
      const waiting = `waiting: ${error.message}`;
      if (step.error !== waiting || !step.startedAt)
        await saveStep(trx, wf, step, { state: 'pending', attempts, error: waiting });
      return false;
    }
    attempts.push({ ...attempt, state: 'failed', error: error.message, finishedAt: nowMs });
    await failAttempt(trx, wf, step, attempts, error.message);
    return true;
  }
}

/** A failed attempt: another one when the step has attempts left, else the workflow fails. */
async function failAttempt(
  trx: Trx,
  wf: MetalWorkflowView,
  step: MetalStepView,
  attempts: StepAttempt[],
  error: string,
): Promise<void> {
  if (attempts.length < step.maxAttempts + retriesGranted(step)) {
    await saveStep(trx, wf, step, { state: 'pending', attempts, error });
    return;
  }
  await saveStep(trx, wf, step, { state: 'failed', attempts, error });
  const reason = reasonOf(
    wf.id,
    `${wf.phase === 'main' ? wf.kind : `the cleanup of ${wf.kind}`} failed at step ${step.name}: ${error}`,
  );
  await trx
    .updateTable('metal_workflows')
    .set({ state: 'failed', reason, updated_at: sql<Date>`compute_now()` })
    .where('id', '=', wf.id)
    .execute();
  await setNodeMaintenance(trx, { nodeId: wf.nodeId, reason, tenantId: wf.tenantId });
  await insertOutboxEvent(trx, {
    type: 'metal.workflow-failed',
    subject: `node/${wf.nodeId}`,
    tenantId: wf.tenantId,
    data: { workflowId: wf.id, nodeId: wf.nodeId, step: step.name, error, phase: wf.phase },
  });
}

/** Each metal.retry grants a step its attempts again (the earlier ones stay in its history). */
function retriesGranted(step: MetalStepView): number {
  const rounds = Math.floor(Math.max(0, step.attempts.length - 1) / step.maxAttempts);
  return rounds * step.maxAttempts;
}

async function cancelCommand(trx: Trx, commandId: string, why: string): Promise<void> {
  await trx
    .updateTable('node_commands')
    .set({ state: 'cancelled', error: why.slice(0, 500), completed_at: sql<Date>`compute_now()` })
    .where('id', '=', commandId)
    .where('state', 'in', ['queued', 'delivered'])
    .execute();
}

/** An abort: the current attempt abandoned, the remaining main steps skipped, cleanup next. */
async function beginCleanup(trx: Trx, wf: MetalWorkflowView): Promise<void> {
  const reason = wf.abortRequested ?? 'aborted';
  const nowMs = (await readComputeNow(trx)).getTime();
  for (const step of wf.steps.filter((s) => s.phase === 'main')) {
    if (step.state === 'succeeded' || step.state === 'skipped') continue;
    const attempts = step.attempts.map((a) =>
      a.state === 'running'
        ? { ...a, state: 'aborted' as const, error: `aborted: ${reason}`, finishedAt: nowMs }
        : a,
    );
    for (const a of step.attempts) {
      if (a.state === 'running' && a.commandId) await cancelCommand(trx, a.commandId, `aborted: ${reason}`);
    }
    const touched = step.state === 'running' || step.state === 'failed' || step.attempts.length > 0;
    await saveStep(trx, wf, step, {
      state: touched ? 'failed' : 'skipped',
      attempts,
      error: touched ? `aborted: ${reason}` : null,
    });
  }
  await trx
    .updateTable('metal_workflows')
    .set({ phase: 'cleanup', state: 'running', updated_at: sql<Date>`compute_now()` })
    .where('id', '=', wf.id)
    .execute();
  await moveProvisionState(trx, {
    nodeId: wf.nodeId,
    to: workflowProvisionStates[wf.kind].cleaning,
    verb: `metal.abort (${wf.kind} workflow)`,
    tenantId: wf.tenantId,
  });
}

/** The workflow is over: the node moved on, maintenance as the outcome says, the event. */
async function finish(
  trx: Trx,
  wf: MetalWorkflowView,
  state: 'succeeded' | 'aborted',
  options: { moveNode: boolean },
): Promise<void> {
  const states = workflowProvisionStates[wf.kind];
  if (options.moveNode) {
    await moveProvisionState(trx, {
      nodeId: wf.nodeId,
      to: state === 'succeeded' ? states.succeeded : states.cleaned,
      verb: `${wf.kind} workflow`,
      tenantId: wf.tenantId,
    });
  }
  const reason =
    state === 'aborted' ? reasonOf(wf.id, `aborted: ${wf.abortRequested ?? 'no reason given'}`) : null;
  if (reason) await setNodeMaintenance(trx, { nodeId: wf.nodeId, reason, tenantId: wf.tenantId });
  else {
    // A success clears the maintenance this workflow's own failure set (before a retry).
    await trx
      .updateTable('nodes')
      .set({ maintenance: false, maintenance_reason: null, updated_at: sql<Date>`compute_now()` })
      .where('id', '=', wf.nodeId)
      .where(sql<boolean>`starts_with(maintenance_reason, ${`workflow ${wf.id}:`})`)
      .execute();
  }
  await trx
    .updateTable('metal_workflows')
    .set({
      state,
      reason: reason ?? wf.reason,
      finished_at: sql<Date>`compute_now()`,
      updated_at: sql<Date>`compute_now()`,
    })
    .where('id', '=', wf.id)
    .execute();
  // A dedicated-root lease's machine, wiped (or given up on, in maintenance): its bookings go now.
  if (wf.kind === 'clean' && wf.allocationId) {
    await freeCleanedMachine(trx, { allocationId: wf.allocationId, workflowId: wf.id, outcome: state });
  }
  await insertOutboxEvent(trx, {
    type: state === 'succeeded' ? 'metal.workflow-succeeded' : 'metal.workflow-aborted',
    subject: `node/${wf.nodeId}`,
    tenantId: wf.tenantId,
    data: { workflowId: wf.id, nodeId: wf.nodeId, kind: wf.kind, reason },
  });
}

async function profileOf(trx: Trx, wf: MetalWorkflowView): Promise<{ spec: ProfileSpec }> {
  if (!wf.profileId || wf.profileVersion === null) {
    throw new ComputeError('INVALID_STATE', `workflow ${wf.id} has no profile`);
  }
  const profile = await findProfile(trx, { profileId: wf.profileId, version: wf.profileVersion });
  if (!profile)
    throw new ComputeError('NOT_FOUND', `profile ${wf.profileId} version ${wf.profileVersion} is gone`);
  return profile;
}

/** The control plane's own steps, inline in the transaction. */
async function runControlPlaneStep(trx: Trx, wf: MetalWorkflowView, step: MetalStepView): Promise<void> {
  switch (step.action.kind) {
    case 'image.check': {
      const profile = await profileOf(trx, wf);
      const image = await findImage(trx, profile.spec.imageId);
      if (!image || !imageUsableBy(image, wf.tenantId)) {
        throw new ComputeError(
          'INVALID_STATE',
          `image ${profile.spec.imageId} is gone or not usable by tenant ${wf.tenantId} (an unverified image is private to its tenant)`,
        );
      }
      await markProfileUsed(trx, wf.profileId!, wf.profileVersion!);
      return;
    }
    case 'acceptance': {
      const profile = await profileOf(trx, wf);
      const gpus = await trx
        .selectFrom('devices')
        .where('node_id', '=', wf.nodeId)
        .where('class', '=', 'gpu')
        .where('removed_at', 'is', null)
        .select(['health'])
        .execute();
      const promised = await trx
        .selectFrom('inventory_snapshots')
        .where('node_id', '=', wf.nodeId)
        .select((eb) => eb.fn.countAll<string>().as('n'))
        .executeTakeFirstOrThrow();
      for (const check of profile.spec.acceptance) {
        if (check === 'inventory-reported' && Number(promised.n) === 0) {
          throw new ComputeError(
            'INVALID_STATE',
            'acceptance inventory-reported: the deployed system sent no inventory',
          );
        }
        if (check === 'gpus-present' && gpus.length === 0) {
          throw new ComputeError(
            'INVALID_STATE',
            'acceptance gpus-present: the deployed system reports no GPU',
          );
        }
        if (check === 'gpus-healthy' && gpus.some((g) => g.health !== 'healthy')) {
          throw new ComputeError(
            'INVALID_STATE',
            `acceptance gpus-healthy: ${gpus.filter((g) => g.health !== 'healthy').length} of ${gpus.length} GPUs are not healthy`,
          );
        }
      }
      return;
    }
    default:
      throw new ComputeError(
        'INTERNAL',
        `step ${step.name}: ${step.action.kind} is not a control-plane step`,
      );
  }
}

/** Queues the one command of an agent step; answers its id. */
async function queueStepCommand(
  trx: Trx,
  wf: MetalWorkflowView,
  step: MetalStepView,
  role: string,
): Promise<string> {
  const action = step.action;
  if (step.target === 'site') {
    if (action.kind !== 'bmc.boot' && action.kind !== 'bmc.power') {
      throw new ComputeError('INTERNAL', `step ${step.name}: ${action.kind} is not a site step`);
    }
    let args: Record<string, unknown>;
    if (action.kind === 'bmc.power') args = { action: action.action };
    else if (action.ramdisk) {
      const minted = await mintDiscoveryToken(trx, {
        nodeId: wf.nodeId,
        siteId: wf.siteId,
        role: 'ramdisk',
        workflowId: wf.id,
        ttlSeconds: discoveryTtlSeconds,
      });
      args = { device: action.device, ramdisk: { discoveryToken: minted.token } };
    } else args = { device: action.device };
    const queued = await enqueueBmcCommand(trx, {
      machineNodeId: wf.nodeId,
      kind: action.kind,
      args,
      notAfterSeconds: step.timeoutSeconds,
    });
    return queued.commandId;
  }
  if (role !== step.target) {
    throw new ComputeError(
      'INVALID_STATE',
      `the machine runs its ${role} agent, not the ${step.target} this step needs`,
    );
  }
  let kind: string;
  let payload: Record<string, unknown>;
  switch (action.kind) {
    case 'disk.wipe':
    case 'logs.collect':
      kind = action.kind;
      payload = { workflowId: wf.id };
      break;
    case 'inventory.refresh':
      kind = action.kind;
      payload = {};
      break;
    case 'deploy.image': {
      const profile = await profileOf(trx, wf);
      const image = await findImage(trx, profile.spec.imageId);
      if (!image) throw new ComputeError('NOT_FOUND', `image ${profile.spec.imageId} is gone`);
      const minted = await mintDiscoveryToken(trx, {
        nodeId: wf.nodeId,
        siteId: wf.siteId,
        role: 'node',
        workflowId: wf.id,
        ttlSeconds: discoveryTtlSeconds,
      });
      kind = 'deploy.image';
      payload = {
        workflowId: wf.id,
        image: {
          id: image.id,
          name: image.name,
          version: image.version,
          format: image.format,
          url: image.url,
          sha256: image.sha256,
        },
        firstBoot: {
          discoveryToken: minted.token,
          ...(profile.spec.userData ? { userData: profile.spec.userData } : {}),
          hostConfig: profile.spec.hostConfig,
        },
      };
      break;
    }
    default:
      throw new ComputeError('INTERNAL', `step ${step.name}: ${action.kind} is not an agent step`);
  }
  const queued = await enqueueNodeCommand(trx, {
    nodeId: wf.nodeId,
    kind,
    payload,
    notAfterSeconds: step.timeoutSeconds,
    byControlPlane: true,
  });
  return queued.id;
}
