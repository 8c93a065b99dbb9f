import { clearLifecycleWake } from '../../db/reservations/lifecycle-wakes.ts';
import { endReservationForCaller } from '../../db/reservations/reservations.ts';
import { readReservationView } from '../../db/reservations/view.ts';
import { reservationRefInput } from '../../domain/reservation-schema.ts';
import { reservationViewSchema } from '../../domain/reservation-view.ts';
import { defineMethod, type MethodContext } from '../method.ts';
import { afterCommit, callerAudit, findVisibleReservation, reservationResource } from './access.ts';

const action = 'compute:reservations:release';

async function end(
  ctx: MethodContext,
  input: { tenantId: string; reservationId: string },
  kind: 'release' | 'cancel',
) {
  const row = await findVisibleReservation(ctx, input.tenantId, input.reservationId);
  await ctx.deps.iam.require(ctx.principal, action, reservationResource(row), { requestId: ctx.requestId });
  const audit = callerAudit(ctx, action);
  const result = await ctx.deps.db.transaction().execute((trx) =>
    endReservationForCaller(trx, {
      reservationId: row.id,
      tenantId: row.tenant_id,
      kind,
      audit,
      wakeOwed: ctx.deps.lifecycle !== undefined,
    }),
  );
  if (result.changed) {
    // Told, the workflow no longer needs the sweeper to wake it (the row stays when this fails).
    await afterCommit(ctx, 'signal', async () => {
      await ctx.deps.lifecycle?.signal(row.id, { type: kind });
      await clearLifecycleWake(ctx.deps.db, row.id);
    });
    if (result.freed) await afterCommit(ctx, 'wakePool', () => ctx.deps.lifecycle?.wakePool(row.pool_id));
    // The preemption it made was called off: its workflow finishes now (and wakes the spot lifecycles).
    const deadlines = new Set((result.calledOff ?? []).map((c) => c.deadline));
    for (const deadline of deadlines) {
      await afterCommit(ctx, 'wakePreemption', () =>
        ctx.deps.lifecycle?.wakePreemption?.(`preemption-${row.id}-${deadline}`),
      );
    }
  } else if (result.state !== null) {
    // Already ended (or releasing): a first call whose process died after its commit never woke
    // the lifecycle, which would otherwise wait for its next timer. The repeat wakes it; one that
    // has finished is left alone.
    await afterCommit(ctx, 'signal', () =>
      ctx.deps.lifecycle?.signal(row.id, { type: 'wake', reason: `${kind} repeated`, ifRunning: true }),
    );
  }
  return (await readReservationView(ctx.deps.db, row.id))!;
}

export const release = defineMethod({
  summary:
    'End a reservation now: the current booking is truncated, future ones deleted, quota refunded. A pending one is cancelled; a terminal one is unchanged. An active kubernetes binding is releasing (DevicesHeld) until its pods let go of the GPUs.',
  action,
  input: reservationRefInput,
  output: reservationViewSchema,
  handler: (ctx, input) => end(ctx, input, 'release'),
});

export const cancel = defineMethod({
  summary: 'Withdraw a reservation that has not started (pending or placed); anything else is INVALID_STATE.',
  action,
  input: reservationRefInput,
  output: reservationViewSchema,
  handler: (ctx, input) => end(ctx, input, 'cancel'),
});
