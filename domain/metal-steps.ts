import type { ProvisionState } from './fleet.ts';

/**
 * Provisioning workflows (deploy, inspect) as persisted steps. A workflow is expanded once, for
 * one machine, into steps; each step runs on one target (`control-plane`: a check in the
 * database; `site`: one `bmc.*` command through the site agent; `ramdisk` or `node`: one command
 * to the agent running on the machine) and is exactly one command per attempt. `awaitRejoin`
 * marks a step that ends the agent's boot: it is done when the named agent joined again after the
 * command. Every step has a timeout and a number of attempts. A failed step leaves the workflow
 * `failed` (the machine in maintenance with the reason) until `metal.retry` resumes from it or
 * `metal.abort` runs the cleanup steps; an abort stops at once, whatever the step waits for.
 */

export const stepTargets = ['control-plane', 'site', 'node', 'ramdisk'] as const;
export type StepTarget = (typeof stepTargets)[number];

export type StepAction =
  | { kind: 'image.check' }
  | { kind: 'bmc.boot'; device: 'pxe' | 'disk'; ramdisk?: true }
  | { kind: 'bmc.power'; action: 'on' | 'off' | 'reset' }
  | { kind: 'disk.wipe' }
  | { kind: 'deploy.image' }
  | { kind: 'inventory.refresh' }
  | { kind: 'logs.collect' }
  | { kind: 'acceptance' };

export interface StepPlan {
  name: string;
  phase: 'main' | 'cleanup';
  target: StepTarget;
  action: StepAction;
  awaitRejoin?: 'ramdisk' | 'node';
  timeoutSeconds: number;
  maxAttempts: number;
}

/**
 * The Temporal names of a provisioning workflow, here so the API can start and wake one without
 * importing workflow code: its type, and `wake`, its one signal.
 */
export const metalWorkflowNames = { type: 'metalWorkflow', wakeSignal: 'wake' } as const;

export const metalWorkflowKinds = ['deploy', 'inspect', 'clean'] as const;
export type MetalWorkflowKind = (typeof metalWorkflowKinds)[number];

export const metalWorkflowStates = ['running', 'succeeded', 'failed', 'aborted'] as const;
export type MetalWorkflowState = (typeof metalWorkflowStates)[number];

/**
 * Where each kind of workflow moves the node (every move checked against domain/provision-states.ts):
 * at its start, on success, while an abort's cleanup runs, and after that cleanup.
 */
export const workflowProvisionStates: Record<
  MetalWorkflowKind,
  { during: ProvisionState; succeeded: ProvisionState; cleaning: ProvisionState; cleaned: ProvisionState }
> = {
  deploy: { during: 'deploying', succeeded: 'deployed', cleaning: 'cleaning', cleaned: 'ready' },
  inspect: { during: 'inspecting', succeeded: 'ready', cleaning: 'inspecting', cleaned: 'enrolling' },
  clean: { during: 'cleaning', succeeded: 'ready', cleaning: 'cleaning', cleaned: 'ready' },
};

/** The cleanup steps every workflow ends an abort with: the machine powered off, set to network boot. */
function cleanupSteps(limits: { timeoutSeconds: number; maxAttempts: number }): StepPlan[] {
  return [
    {
      name: 'cleanup-power-off',
      phase: 'cleanup',
      target: 'site',
      action: { kind: 'bmc.power', action: 'off' },
      ...limits,
    },
    {
      name: 'cleanup-boot-network',
      phase: 'cleanup',
      target: 'site',
      action: { kind: 'bmc.boot', device: 'pxe' },
      ...limits,
    },
  ];
}

/** The steps that bring the machine into the ramdisk over the network boot of its site agent. */
function bootRamdiskSteps(limits: { timeoutSeconds: number; maxAttempts: number }): StepPlan[] {
  return [
    {
      name: 'power-off',
      phase: 'main',
      target: 'site',
      action: { kind: 'bmc.power', action: 'off' },
      ...limits,
    },
    {
      name: 'boot-network',
      phase: 'main',
      target: 'site',
      action: { kind: 'bmc.boot', device: 'pxe', ramdisk: true },
      ...limits,
    },
    {
      name: 'power-on-ramdisk',
      phase: 'main',
      target: 'site',
      action: { kind: 'bmc.power', action: 'on' },
      awaitRejoin: 'ramdisk',
      ...limits,
    },
  ];
}

/**
 * A deploy expanded for one machine: check the image, boot the ramdisk, wipe the disk, stream the
 * image (digest checked), boot the disk, wait for the deployed system to join as the node, run
 * the acceptance checks. Cleanup: power off and back to network boot.
 */
export function planDeploy(limits: { timeoutSeconds?: number; maxAttempts: number }): StepPlan[] {
  const l = { timeoutSeconds: limits.timeoutSeconds ?? 300, maxAttempts: limits.maxAttempts };
  return [
    {
      name: 'check-image',
      phase: 'main',
      target: 'control-plane',
      action: { kind: 'image.check' },
      ...l,
      maxAttempts: 1,
    },
    ...bootRamdiskSteps(l),
    { name: 'wipe-disk', phase: 'main', target: 'ramdisk', action: { kind: 'disk.wipe' }, ...l },
    { name: 'write-image', phase: 'main', target: 'ramdisk', action: { kind: 'deploy.image' }, ...l },
    { name: 'boot-disk', phase: 'main', target: 'site', action: { kind: 'bmc.boot', device: 'disk' }, ...l },
    {
      name: 'reboot-into-image',
      phase: 'main',
      target: 'site',
      action: { kind: 'bmc.power', action: 'reset' },
      awaitRejoin: 'node',
      ...l,
    },
    {
      name: 'acceptance',
      phase: 'main',
      target: 'control-plane',
      action: { kind: 'acceptance' },
      ...l,
      maxAttempts: 1,
    },
    ...cleanupSteps(l),
  ];
}

/** Inspection of an enrolled machine: boot the ramdisk, read its inventory, power off. */
export function planInspect(limits: { timeoutSeconds?: number; maxAttempts: number }): StepPlan[] {
  const l = { timeoutSeconds: limits.timeoutSeconds ?? 300, maxAttempts: limits.maxAttempts };
  return [
    ...bootRamdiskSteps(l),
    { name: 'read-inventory', phase: 'main', target: 'ramdisk', action: { kind: 'inventory.refresh' }, ...l },
    {
      name: 'power-off-inspected',
      phase: 'main',
      target: 'site',
      action: { kind: 'bmc.power', action: 'off' },
      ...l,
    },
    ...cleanupSteps(l),
  ];
}

/** Cleaning of a released machine: boot the ramdisk, wipe the disk, power off. */
export function planClean(limits: { timeoutSeconds?: number; maxAttempts: number }): StepPlan[] {
  const l = { timeoutSeconds: limits.timeoutSeconds ?? 300, maxAttempts: limits.maxAttempts };
  return [
    ...bootRamdiskSteps(l),
    { name: 'wipe-disk', phase: 'main', target: 'ramdisk', action: { kind: 'disk.wipe' }, ...l },
    {
      name: 'power-off-cleaned',
      phase: 'main',
      target: 'site',
      action: { kind: 'bmc.power', action: 'off' },
      ...l,
    },
    ...cleanupSteps(l),
  ];
}

/** One attempt of a step as persisted. */
export interface StepAttempt {
  n: number;
  commandId: string | null;
  state: 'running' | 'succeeded' | 'failed' | 'aborted';
  error: string | null;
  /** The node's session epoch when the attempt began (a rejoin is a later session). */
  epochBefore: number;
  startedAt: number;
  finishedAt: number | null;
}

/** What a running attempt is waiting on, as the database shows it now. */
export interface AttemptProgress {
  command: { state: string; error: string | null; result: Record<string, unknown> | null } | null;
  node: { role: string; connectivity: string; epoch: number };
  nowMs: number;
}

export type AttemptVerdict =
  | { kind: 'wait' }
  | { kind: 'succeeded'; detail?: string }
  | { kind: 'failed'; error: string };

/**
 * The verdict on a running attempt: its command's outcome, then (with `awaitRejoin`) whether the
 * named agent joined again since the attempt began, and the step's timeout. Pure.
 */
export function judgeAttempt(
  step: { awaitRejoin?: 'ramdisk' | 'node' | null | undefined; timeoutSeconds: number; name: string },
  attempt: StepAttempt,
  progress: AttemptProgress,
): AttemptVerdict {
  const command = progress.command;
  if (
    command &&
    (command.state === 'failed' || command.state === 'expired' || command.state === 'cancelled')
  ) {
    return { kind: 'failed', error: command.error ?? `the command ${command.state}` };
  }
  const commandDone = command === null || command.state === 'succeeded';
  const rejoined =
    !step.awaitRejoin ||
    (progress.node.role === step.awaitRejoin &&
      progress.node.connectivity === 'connected' &&
      progress.node.epoch > attempt.epochBefore);
  if (commandDone && rejoined) return { kind: 'succeeded' };
  if (progress.nowMs - attempt.startedAt > step.timeoutSeconds * 1000) {
    return {
      kind: 'failed',
      error: !commandDone
        ? `timed out after ${step.timeoutSeconds} s waiting for the command (${command?.state})`
        : `timed out after ${step.timeoutSeconds} s waiting for the ${step.awaitRejoin} to join`,
    };
  }
  return { kind: 'wait' };
}
