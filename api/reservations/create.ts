import { readReservationView } from '../../db/reservations/view.ts';
import { createReservationInput } from '../../domain/reservation-schema.ts';
import { type ReservationView, reservationViewSchema } from '../../domain/reservation-view.ts';
import { defineMethod, type MethodContext } from '../method.ts';
import { admitReservation } from './admission.ts';

/** The longest a `wait` holds an answer. */
export const maxWaitMs = 30_000;

/**
 * Re-reads the reservation (backing off from 50 ms to 1 s) while its operation is `running`, until
 * `timeoutMs` (capped at 30 s) passes or the caller goes away; answers the last read either way.
 */
export async function waitForOperation(ctx: MethodContext, view: ReservationView, timeoutMs: number) {
  const deadline = Date.now() + Math.min(timeoutMs, maxWaitMs);
  let delay = 50;
  let current = view;
  while (current.operation.state === 'running' && Date.now() < deadline && !ctx.signal.aborted) {
    await new Promise((resolve) => setTimeout(resolve, Math.min(delay, Math.max(0, deadline - Date.now()))));
    delay = Math.min(delay * 2, 1_000);
    current = (await readReservationView(ctx.deps.db, current.id)) ?? current;
  }
  return current;
}

export const create = defineMethod({
  summary:
    'Reserve devices of a pool for a time window, idempotently by key: a draft, one IAM decision, then quota and placement (placed, or pending with an Unschedulable condition).',
  action: 'compute:reservations:create',
  input: createReservationInput,
  output: reservationViewSchema,
  handler: async (ctx, input) => {
    const view = await admitReservation(ctx, input);
    return input.wait ? waitForOperation(ctx, view, input.wait.timeoutMs) : view;
  },
});
