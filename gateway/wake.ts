import { findLiveReservationsOnNodes } from '../db/nodes/workloads.ts';
import type { GatewayContext } from './context.ts';

type WakeContext = Pick<GatewayContext, 'db' | 'log' | 'lifecycle' | 'outage'>;

/**
 * Wakes these reservations' lifecycles. A wake-up is only a hint: the workflow re-reads
 * PostgreSQL and acts on the difference, so a lost one costs at most the workflow's own recheck
 * interval. Never rejects: a failed wake-up is logged.
 */
export async function wakeReservations(
  ctx: WakeContext,
  reservationIds: readonly string[],
  reason: string,
): Promise<void> {
  const lifecycle = ctx.lifecycle;
  if (!lifecycle) return;
  await Promise.all(
    reservationIds.map((reservationId) =>
      lifecycle.signal(reservationId, { type: 'wake', reason }).then(
        () => ctx.outage.reachable('temporal'),
        (err: unknown) => {
          if (!ctx.outage.failed(err, 'lifecycle wake')) {
            ctx.log.warn({ err, reservationId, reason }, 'lifecycle wake failed');
          }
        },
      ),
    ),
  );
}

/**
 * Wakes the lifecycle of every live reservation holding an allocation on these nodes (their
 * connectivity or health changed). Never rejects: a failed read or wake-up is logged (the
 * workflow's own recheck covers it).
 */
export async function wakeReservationsOnNodes(
  ctx: WakeContext,
  nodeIds: readonly string[],
  reason: string,
): Promise<void> {
  if (!ctx.lifecycle || nodeIds.length === 0) return;
  await findLiveReservationsOnNodes(ctx.db, nodeIds)
    .then((reservationIds) => wakeReservations(ctx, reservationIds, reason))
    .catch((err: unknown) => {
      if (!ctx.outage.failed(err, 'lifecycle wake')) {
        ctx.log.warn({ err, nodeIds: nodeIds.slice(0, 20), reason }, 'lifecycle wake-ups failed');
      }
    });
}

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
