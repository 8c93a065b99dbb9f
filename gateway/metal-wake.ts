import type { GatewayContext } from './context.ts';

/**
 * Wakes the provisioning workflow running on a machine once what its step waits on is stored (the
 * step's command answered, the machine's agent joined again), so the next step starts now rather
 * than at the workflow's next look. Only a hint: a lost one costs that look's interval. Never
 * rejects; a failure is logged.
 */
export function wakeMetalWorkflow(
  ctx: Pick<GatewayContext, 'log' | 'lifecycle' | 'outage'>,
  workflowId: string | null,
  reason: string,
): void {
  const lifecycle = ctx.lifecycle;
  if (!workflowId || !lifecycle?.wakeMetalWorkflow) return;
  lifecycle.wakeMetalWorkflow(workflowId).then(
    () => ctx.outage.reachable('temporal'),
    (err: unknown) => {
      if (!ctx.outage.failed(err, 'metal workflow wake')) {
        ctx.log.warn(
          { err, workflowId, reason },
          'could not wake a provisioning workflow; it looks again soon',
        );
      }
    },
  );
}
