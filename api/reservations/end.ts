import { admissionContext, insertAuditEvent } from '../../db/events/audit.ts';
import { lockReservation, releaseReservation } from '../../db/reservations/reservations.ts';
import { readReservationView } from '../../db/reservations/view.ts';
import { ComputeError } from '../../domain/errors.ts';
import { reservationRefInput } from '../../domain/reservation-schema.ts';
import { reservationViewSchema } from '../../domain/reservation-view.ts';
import { defineMethod, type MethodContext } from '../method.ts';
import { afterCommit, findVisibleReservation, preCheckTenant, reservationResource } from './access.ts';

const action = 'compute:reservations:release';

async function end(
  ctx: MethodContext,
  input: { tenantId: string; reservationId: string },
  kind: 'release' | 'cancel',
) {
  await preCheckTenant(ctx, input.tenantId);
  const row = await findVisibleReservation(ctx, input.tenantId, input.reservationId);
  await ctx.deps.iam.require(ctx.principal, action, reservationResource(row), { requestId: ctx.requestId });
  const result = await ctx.deps.db.transaction().execute(async (trx) => {
    const locked = await lockReservation(trx, row.id);
    if (
      kind === 'cancel' &&
      locked &&
      !['pending', 'placed', 'awaiting-confirmation'].includes(locked.state)
    ) {
      throw new ComputeError(
        'INVALID_STATE',
        `reservation ${row.id} is ${locked.state}: only a pending or placed reservation that has not started can be cancelled; release it instead`,
        { state: locked.state },
      );
    }
    const released = await releaseReservation(trx, row.id, kind);
    if (released.changed) {
      await insertAuditEvent(trx, {
        tenantId: row.tenant_id,
        actorIdentityId: ctx.principal.identityId,
        action,
        resourceType: 'compute-reservation',
        resourceId: row.id,
        requestId: ctx.requestId,
        context: { ...admissionContext(ctx.principal, ctx.requestId), kind, state: released.state },
      });
    }
    return released;
  });
  if (result.changed) {
    await afterCommit(ctx, 'signal', () => ctx.deps.lifecycle?.signal(row.id, { type: kind }));
    if (result.freed) await afterCommit(ctx, 'wakePool', () => ctx.deps.lifecycle?.wakePool(row.pool_id));
  }
  return (await readReservationView(ctx.deps.db, row.id))!;
}

export const release = defineMethod({
  summary:
    'End a reservation now: the current booking is truncated, future ones deleted, quota refunded. A pending one is cancelled; a terminal one is unchanged.',
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
