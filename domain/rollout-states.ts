/** A rollout's state: the closed set the API, the workflow's search attribute and the CLI share. */
export const rolloutStates = ['running', 'paused', 'completed', 'aborted'] as const;
export type RolloutState = (typeof rolloutStates)[number];

/** One node's place in a rollout. */
export const rolloutNodeStates = [
  'pending',
  'updating',
  'soaking',
  'done',
  'failed',
  'skipped',
  'rolling-back',
  'rolled-back',
] as const;
export type RolloutNodeState = (typeof rolloutNodeStates)[number];

/** Nodes that count against their pool's disruption budget. */
export const inProgressNodeStates = [
  'updating',
  'soaking',
  'rolling-back',
] as const satisfies readonly RolloutNodeState[];

export function isNodeInProgress(state: RolloutNodeState): boolean {
  return (inProgressNodeStates as readonly string[]).includes(state);
}

/** What `abort` does to nodes already updated: leaves them, or rolls them back in reverse waves. */
export const rolloutAbortModes = ['stop', 'rollback'] as const;
export type RolloutAbortMode = (typeof rolloutAbortModes)[number];

/** What an operator asked the rollout's workflow (its signals), applied by the next advance. */
export type RolloutRequest =
  | { kind: 'pause'; reason?: string }
  | { kind: 'resume' }
  | { kind: 'abort'; rollback: boolean };

/** The rollout workflow's type and signal names (workflows/rollout), for callers that hold only a client. */
export const rolloutWorkflow = {
  type: 'rolloutWorkflow',
  signals: { pause: 'pause', resume: 'resume', abort: 'abort' },
} as const;

/**
 * How a rollout's workflow is started (id = the rollout id), by the API after `rollouts.create`
 * commits and by the orphan sweeper when that start never happened. Starting it again while it
 * runs is refused by its id (harmless).
 */
export function rolloutWorkflowStart(
  rolloutId: string,
  taskQueue: string,
): { workflowId: string; taskQueue: string; args: [{ rolloutId: string }] } {
  return { workflowId: rolloutId, taskQueue, args: [{ rolloutId }] };
}
