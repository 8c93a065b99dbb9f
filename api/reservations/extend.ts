import { z } from 'zod';
import { readAuthzResource } from '../../db/iam/authz.ts';
import {
  abandonExtend,
  commitExtend,
  type ExtendOutcome,
  renewLeaseNow,
  stageExtendWindow,
} from '../../db/reservations/extend.ts';
import { readReservationView } from '../../db/reservations/view.ts';
import { parseDuration } from '../../domain/duration.ts';
import { ComputeError } from '../../domain/errors.ts';
import { extendInput, reservationRefInput } from '../../domain/reservation-schema.ts';
import { isRenewable } from '../../domain/reservation-states.ts';
import { reservationViewSchema } from '../../domain/reservation-view.ts';
import { defineMethod } from '../method.ts';
import {
  afterCommit,
  callerAudit,
  findVisibleReservation,
  preCheckTenant,
  reservationResource,
} from './access.ts';

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
    const staged = await ctx.deps.db
      .transaction()
      .execute((trx) => stageExtendWindow(trx, { reservationId: row.id, until: input.until, byMs: by }));
    if (staged.noop) {
      return {
        reservation: (await readReservationView(ctx.deps.db, row.id))!,
        extended: false,
        availableUntil: staged.window.end,
      };
    }
    let outcome: ExtendOutcome;
    try {
      const resource =
        (await readAuthzResource(ctx.deps.db, 'compute-reservation', row.id)) ?? reservationResource(row);
      await ctx.deps.iam.require(ctx.principal, 'compute:reservations:extend', resource, {
        requestId: ctx.requestId,
      });
      const audit = callerAudit(ctx, 'compute:reservations:extend');
      outcome = await ctx.deps.db.transaction().execute((trx) =>
        commitExtend(trx, {
          reservationId: row.id,
          tenantId: row.tenant_id,
          staged,
          idempotencyKey: input.idempotencyKey,
          audit,
        }),
      );
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
    if (!isRenewable(row.state)) {
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
      const renewed = await renewLeaseNow(ctx.deps.db, row.id);
      if (!renewed)
        throw new ComputeError('INVALID_STATE', `reservation ${row.id} ended before its lease was renewed`);
    }
    return (await readReservationView(ctx.deps.db, row.id))!;
  },
});
