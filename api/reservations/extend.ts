import { sql } from 'kysely';
import { z } from 'zod';
import type { Db } from '../../core/database.ts';
import { admissionContext, insertAuditEvent } from '../../db/events/audit.ts';
import { readAuthzResource } from '../../db/iam/authz.ts';
import { abandonExtend, applyExtend, stageExtend } from '../../db/reservations/extend.ts';
import { lockReservation } from '../../db/reservations/reservations.ts';
import { readReservationView } from '../../db/reservations/view.ts';
import { parseDuration } from '../../domain/duration.ts';
import { ComputeError } from '../../domain/errors.ts';
import { extendInput, maxDurationMs, reservationRefInput } from '../../domain/reservation-schema.ts';
import { reservationViewSchema } from '../../domain/reservation-view.ts';
import { defineMethod } from '../method.ts';
import { afterCommit, findVisibleReservation, preCheckTenant, reservationResource } from './access.ts';

const extendable = ['placed', 'binding', 'active'];

async function windowOf(trx: Db, reservationId: string): Promise<{ start: number; end: number } | null> {
  const { rows } = await sql<{ s: Date | null; e: Date | null }>`
    SELECT lower(during) AS s, upper(during) AS e FROM reservations WHERE id = ${reservationId}`.execute(trx);
  const row = rows[0];
  return row?.s && row.e ? { start: row.s.getTime(), end: row.e.getTime() } : null;
}

export const extend = defineMethod({
  summary:
    "Move a reservation's end later, all or nothing: exactly one of until (epoch ms) or by (a duration). Answers extended: false with availableUntil when another booking starts first.",
  action: 'compute:reservations:extend',
  input: extendInput,
  output: z.object({
    reservation: reservationViewSchema,
    extended: z.boolean(),
    availableUntil: z.number().optional(),
  }),
  handler: async (ctx, input) => {
    await preCheckTenant(ctx, input.tenantId);
    const row = await findVisibleReservation(ctx, input.tenantId, input.reservationId);
    const by = input.by !== undefined ? parseDuration(input.by, 'by') : undefined;
    // Transaction 1: the slot and the pending change the decision reads.
    const staged = await ctx.deps.db.transaction().execute(async (trx) => {
      const locked = (await lockReservation(trx, row.id))!;
      if (!extendable.includes(locked.state)) {
        throw new ComputeError(
          'INVALID_STATE',
          `reservation ${row.id} is ${locked.state}: only placed, binding or active reservations extend`,
          { state: locked.state },
        );
      }
      const window = await windowOf(trx, row.id);
      if (!window)
        throw new ComputeError('INVALID_STATE', `reservation ${row.id} has no booked window to extend`);
      const newEnd = input.until ?? window.end + by!;
      if (newEnd <= window.end) return { noop: true as const, window };
      if (newEnd - window.start > maxDurationMs) {
        throw new ComputeError(
          'INVALID_INPUT',
          `${input.until ? 'until' : 'by'}: a reservation lasts at most 90d`,
        );
      }
      const current = (await readAuthzResource(trx, 'compute-reservation', row.id))?.attributes ?? {};
      const attributes = {
        ...current,
        durationHours: Math.round(((newEnd - window.start) / 3_600_000) * 1000) / 1000,
      };
      const hold = await stageExtend(trx, row.id, { durationHours: attributes.durationHours });
      if (!hold) {
        throw new ComputeError(
          'CONFLICT',
          `another extend of reservation ${row.id} is in flight; retry in a minute`,
          {
            reason: 'extend-in-flight',
            retryAfterSeconds: 60,
          },
        );
      }
      return { noop: false as const, window, newEnd, hold, attributes };
    });
    if (staged.noop) {
      return {
        reservation: (await readReservationView(ctx.deps.db, row.id))!,
        extended: false,
        availableUntil: staged.window.end,
      };
    }
    let outcome: Awaited<ReturnType<typeof applyExtend>>;
    try {
      const resource =
        (await readAuthzResource(ctx.deps.db, 'compute-reservation', row.id)) ?? reservationResource(row);
      await ctx.deps.iam.require(ctx.principal, 'compute:reservations:extend', resource, {
        requestId: ctx.requestId,
      });
      outcome = await ctx.deps.db.transaction().execute(async (trx) => {
        await lockReservation(trx, row.id);
        const result = await applyExtend(trx, {
          reservationId: row.id,
          hold: staged.hold,
          currentEnd: staged.window.end,
          newEnd: staged.newEnd,
          attributes: staged.attributes,
        });
        if (result.extended) {
          await insertAuditEvent(trx, {
            tenantId: row.tenant_id,
            actorIdentityId: ctx.principal.identityId,
            action: 'compute:reservations:extend',
            resourceType: 'compute-reservation',
            resourceId: row.id,
            requestId: ctx.requestId,
            context: {
              ...admissionContext(ctx.principal, ctx.requestId),
              idempotencyKey: input.idempotencyKey,
              end: result.end,
            },
          });
        }
        return result;
      });
    } finally {
      // A refusal, a throw after the allow, or no room: the pending change never outlives this call.
      await abandonExtend(ctx.deps.db, row.id, staged.hold);
    }
    if (outcome.extended) {
      await afterCommit(ctx, 'signal', () =>
        ctx.deps.lifecycle?.signal(row.id, { type: 'extended', end: outcome.end }),
      );
    }
    const reservation = (await readReservationView(ctx.deps.db, row.id))!;
    return outcome.extended
      ? { reservation, extended: true }
      : { reservation, extended: false, availableUntil: outcome.availableUntil };
  },
});

export const renew = defineMethod({
  summary:
    'Move the lease of a reservation made with leaseSeconds to now + leaseSeconds (placed, binding or active).',
  action: 'compute:reservations:extend',
  input: reservationRefInput,
  output: reservationViewSchema,
  handler: async (ctx, input) => {
    await preCheckTenant(ctx, input.tenantId);
    const row = await findVisibleReservation(ctx, input.tenantId, input.reservationId);
    if (row.lease_seconds === null) {
      throw new ComputeError(
        'INVALID_STATE',
        `reservation ${row.id} was made without leaseSeconds: it has no lease to renew`,
      );
    }
    if (!extendable.includes(row.state)) {
      throw new ComputeError(
        'INVALID_STATE',
        `a lease renews in placed, binding or active; reservation ${row.id} is ${row.state}`,
        {
          state: row.state,
        },
      );
    }
    await ctx.deps.iam.require(ctx.principal, 'compute:reservations:extend', reservationResource(row), {
      requestId: ctx.requestId,
    });
    if (ctx.deps.lifecycle?.renew) {
      await ctx.deps.lifecycle.renew(row.id);
    } else {
      const renewed = await ctx.deps.db
        .updateTable('reservations')
        .set({
          lease_expires_at: sql<Date>`compute_now() + make_interval(secs => lease_seconds)`,
          version: sql<number>`version + 1`,
          updated_at: sql<Date>`compute_now()`,
        })
        .where('id', '=', row.id)
        .where('state', 'in', extendable as never)
        .returning('id')
        .executeTakeFirst();
      if (!renewed)
        throw new ComputeError('INVALID_STATE', `reservation ${row.id} ended before its lease was renewed`);
    }
    return (await readReservationView(ctx.deps.db, row.id))!;
  },
});
