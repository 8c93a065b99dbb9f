import { sql } from 'kysely';
import { z } from 'zod';
import { readReservationView, readReservationViews } from '../../db/reservations/view.ts';
import { listReservationsInput, reservationRefInput } from '../../domain/reservation-schema.ts';
import { reservationViewSchema } from '../../domain/reservation-view.ts';
import { defineMethod } from '../method.ts';
import { findVisibleReservation, preCheckTenant, reservationResource } from './access.ts';

export const get = defineMethod({
  summary: 'One reservation of the tenant (drafts are NOT_FOUND).',
  action: 'compute:reservations:read',
  input: reservationRefInput,
  output: reservationViewSchema,
  handler: async (ctx, input) => {
    await preCheckTenant(ctx, input.tenantId);
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
    await preCheckTenant(ctx, input.tenantId);
    await ctx.deps.iam.require(
      ctx.principal,
      'compute:reservations:read',
      {
        type: 'compute-tenant',
        id: input.tenantId,
        tenantId: input.tenantId,
        attributes: { scope: input.scope ?? 'mine' },
      },
      { requestId: ctx.requestId },
    );
    const limit = input.limit ?? 50;
    const states =
      input.state === undefined ? null : Array.isArray(input.state) ? input.state : [input.state];
    let query = ctx.deps.db
      .selectFrom('reservations')
      .select(['id', 'created_at'])
      .where('tenant_id', '=', input.tenantId)
      .where('state', '<>', 'draft');
    if ((input.scope ?? 'mine') === 'mine')
      query = query.where('owner_identity_id', '=', ctx.principal.identityId);
    if (states) query = query.where('state', 'in', states);
    if (input.poolId) query = query.where('pool_id', '=', input.poolId);
    if (input.cursor) {
      query = query.where(
        sql<boolean>`(created_at, id) < (SELECT r.created_at, r.id FROM reservations r
                      WHERE r.id = ${input.cursor} AND r.tenant_id = ${input.tenantId})`,
      );
    }
    const rows = await query
      .orderBy('created_at', 'desc')
      .orderBy('id', 'desc')
      .limit(limit + 1)
      .execute();
    const page = rows.slice(0, limit);
    return {
      reservations: await readReservationViews(
        ctx.deps.db,
        page.map((r) => r.id),
      ),
      nextCursor: rows.length > limit ? page[page.length - 1]!.id : null,
    };
  },
});
