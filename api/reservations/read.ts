import { z } from 'zod';
import { listReservationIds, readReservationView, readReservationViews } from '../../db/reservations/view.ts';
import { listReservationsInput, reservationRefInput } from '../../domain/reservation-schema.ts';
import { reservationViewSchema } from '../../domain/reservation-view.ts';
import { defineMethod } from '../method.ts';
import { findVisibleReservation, requireOnTenant, reservationResource } from './access.ts';

export const get = defineMethod({
  summary: 'One reservation of the tenant (drafts are NOT_FOUND).',
  action: 'compute:reservations:read',
  input: reservationRefInput,
  output: reservationViewSchema,
  handler: async (ctx, input) => {
    const row = await findVisibleReservation(ctx, input.tenantId, input.reservationId);
    await ctx.deps.iam.require(ctx.principal, 'compute:reservations:read', reservationResource(row), {
      requestId: ctx.requestId,
    });
    return (await readReservationView(ctx.deps.db, row.id))!;
  },
});

export const list = defineMethod({
  summary:
    "The caller's reservations (scope 'mine', default) or the tenant's ('all'), newest first, filtered by state and poolId, paged by limit (1 to 200, default 50) and cursor.",
  action: 'compute:reservations:read',
  input: listReservationsInput,
  output: z.object({ reservations: z.array(reservationViewSchema), nextCursor: z.string().nullable() }),
  handler: async (ctx, input) => {
    await requireOnTenant(ctx, input.tenantId, 'compute:reservations:read', { scope: input.scope ?? 'mine' });
    const limit = input.limit ?? 50;
    const { ids, more } = await listReservationIds(ctx.deps.db, {
      tenantId: input.tenantId,
      ...((input.scope ?? 'mine') === 'mine' ? { ownerIdentityId: ctx.principal.identityId } : {}),
      ...(input.state === undefined
        ? {}
        : { states: Array.isArray(input.state) ? input.state : [input.state] }),
      poolId: input.poolId,
      cursor: input.cursor,
      limit,
    });
    return {
      reservations: await readReservationViews(ctx.deps.db, ids),
      nextCursor: more ? ids[ids.length - 1]! : null,
    };
  },
});
