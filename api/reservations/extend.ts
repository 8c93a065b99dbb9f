import { z } from 'zod';
import { readAuthzResource } from '../../db/iam/authz.ts';
import {
  commitExtend,
  findCommittedExtend,
  planExtend,
  renewLeaseNow,
  replayCommittedExtend,
} from '../../db/reservations/extend.ts';
import { readReservationView } from '../../db/reservations/view.ts';
import { parseDuration } from '../../domain/duration.ts';
import { ComputeError } from '../../domain/errors.ts';
import { extendRequestHash } from '../../domain/reservation-request.ts';
import { extendInput, reservationRefInput } from '../../domain/reservation-schema.ts';
import { isRenewable } from '../../domain/reservation-states.ts';
import { reservationViewSchema } from '../../domain/reservation-view.ts';
import { defineMethod } from '../method.ts';
import { afterCommit, callerAudit, findVisibleReservation, reservationResource } from './access.ts';

const action = 'compute:reservations:extend';

export const extend = defineMethod({
  summary:
    "Move a reservation's end later, all or nothing: exactly one of until (epoch ms) or by (a duration). Answers extended: false with availableUntil when another booking starts first. Idempotent by key: a retry answers the extend it already made.",
  action,
  input: extendInput,
  output: z.object({
    reservation: reservationViewSchema,
    extended: z.boolean(),
    availableUntil: z.number().optional(),
  }),
  /**
   * A repeated key answers its committed extend (no decision, nothing changes twice; another
   * request under it is CONFLICT). Otherwise: the plan (read only), exactly one IAM decision on the
   * new duration, then one transaction that takes the extend slot, moves every booking's end and
   * stores the key. A caller IAM refuses never takes the slot, so it cannot hold up the owner's
   * extends.
   */
  handler: async (ctx, input) => {
    const row = await findVisibleReservation(ctx, input.tenantId, input.reservationId);
    const target = {
      until: input.until,
      byMs: input.by !== undefined ? parseDuration(input.by, 'by') : undefined,
    };
    const requestHash = extendRequestHash({ tenantId: row.tenant_id, reservationId: row.id, ...target });
    const view = async () => (await readReservationView(ctx.deps.db, row.id))!;
    const key = { reservationId: row.id, idempotencyKey: input.idempotencyKey, requestHash };
    const committed = await findCommittedExtend(ctx.deps.db, {
      ...key,
      actorIdentityId: ctx.principal.identityId,
    });
    if (committed) {
      replayCommittedExtend(committed, key);
      return { reservation: await view(), extended: true };
    }
    const planned = await planExtend(ctx.deps.db, { reservationId: row.id, state: row.state, ...target });
    if (planned.noop)
      return { reservation: await view(), extended: false, availableUntil: planned.window.end };
    const stored =
      (await readAuthzResource(ctx.deps.db, 'compute-reservation', row.id)) ?? reservationResource(row);
    await ctx.deps.iam.require(
      ctx.principal,
      action,
      { ...stored, attributes: planned.attributes },
      { requestId: ctx.requestId, requestHash },
    );
    const audit = callerAudit(ctx, action);
    const outcome = await ctx.deps.db.transaction().execute((trx) =>
      commitExtend(trx, {
        reservationId: row.id,
        tenantId: row.tenant_id,
        target,
        planned,
        idempotencyKey: input.idempotencyKey,
        requestHash,
        audit,
      }),
    );
    if (outcome.extended && !('replayed' in outcome)) {
      await afterCommit(ctx, 'signal', () =>
        ctx.deps.lifecycle?.signal(row.id, { type: 'extended', end: outcome.end }),
      );
    }
    const reservation = await view();
    return outcome.extended
      ? { reservation, extended: true }
      : { reservation, extended: false, availableUntil: outcome.availableUntil };
  },
});

export const renew = defineMethod({
  summary:
    'Move the lease of a reservation made with leaseSeconds to now + leaseSeconds (placed, binding or active).',
  action,
  input: reservationRefInput,
  output: reservationViewSchema,
  handler: async (ctx, input) => {
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
    await ctx.deps.iam.require(ctx.principal, action, reservationResource(row), {
      requestId: ctx.requestId,
    });
    // The lease moves in PostgreSQL (guarded by state, raising the version), then the lifecycle is
    // woken to re-read its deadline: a worker that is down never holds the answer (afterCommit).
    const renewed = await renewLeaseNow(ctx.deps.db, row.id);
    if (!renewed)
      throw new ComputeError('INVALID_STATE', `reservation ${row.id} ended before its lease was renewed`);
    await afterCommit(ctx, 'renew', () =>
      ctx.deps.lifecycle?.signal(row.id, { type: 'wake', reason: 'renewed' }),
    );
    return (await readReservationView(ctx.deps.db, row.id))!;
  },
});
