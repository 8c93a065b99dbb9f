import { z } from 'zod';
import type { MetalWorkflowView } from '../../db/metal/workflows.ts';
import { metalWorkflowKinds, metalWorkflowStates, stepTargets } from '../../domain/metal-steps.ts';

const attemptOut = z.object({
  n: z.number().int(),
  commandId: z.string().nullable(),
  state: z.enum(['running', 'succeeded', 'failed', 'aborted']),
  error: z.string().nullable(),
  startedAt: z.number(),
  finishedAt: z.number().nullable(),
});

export const stepOut = z.object({
  idx: z.number().int(),
  phase: z.enum(['main', 'cleanup']),
  name: z.string(),
  target: z.enum(stepTargets),
  action: z.record(z.string(), z.unknown()),
  awaitRejoin: z.enum(['ramdisk', 'node']).nullable(),
  timeoutSeconds: z.number().int(),
  maxAttempts: z.number().int(),
  state: z.enum(['pending', 'running', 'succeeded', 'failed', 'skipped']),
  attempts: z.array(attemptOut),
  error: z.string().nullable(),
  startedAt: z.number().nullable(),
  finishedAt: z.number().nullable(),
});

export const workflowOut = z.object({
  id: z.string(),
  kind: z.enum(metalWorkflowKinds),
  nodeId: z.string(),
  siteId: z.string(),
  tenantId: z.string(),
  profileId: z.string().nullable(),
  profileVersion: z.number().int().nullable(),
  state: z.enum(metalWorkflowStates),
  phase: z.enum(['main', 'cleanup']),
  /** Why it failed or was aborted (also the node's maintenance reason). */
  reason: z.string().nullable(),
  abortRequested: z.string().nullable(),
  createdAt: z.number(),
  updatedAt: z.number(),
  finishedAt: z.number().nullable(),
  steps: z.array(stepOut),
});

export function workflowView(wf: MetalWorkflowView): z.infer<typeof workflowOut> {
  return {
    id: wf.id,
    kind: wf.kind,
    nodeId: wf.nodeId,
    siteId: wf.siteId,
    tenantId: wf.tenantId,
    profileId: wf.profileId,
    profileVersion: wf.profileVersion,
    state: wf.state,
    phase: wf.phase,
    reason: wf.reason,
    abortRequested: wf.abortRequested,
    createdAt: wf.createdAt.getTime(),
    updatedAt: wf.updatedAt.getTime(),
    finishedAt: wf.finishedAt?.getTime() ?? null,
    steps: wf.steps.map((s) => ({
      idx: s.idx,
      phase: s.phase,
      name: s.name,
      target: s.target,
      action: s.action as Record<string, unknown>,
      awaitRejoin: s.awaitRejoin,
      timeoutSeconds: s.timeoutSeconds,
      maxAttempts: s.maxAttempts,
      state: s.state,
      attempts: s.attempts.map((a) => ({
        n: a.n,
        commandId: a.commandId,
        state: a.state,
        error: a.error,
        startedAt: a.startedAt,
        finishedAt: a.finishedAt,
      })),
      error: s.error,
      startedAt: s.startedAt?.getTime() ?? null,
      finishedAt: s.finishedAt?.getTime() ?? null,
    })),
  };
}
