import { sql, type Transaction } from 'kysely';
import type { Database, Db } from '../../core/database.ts';
import { machineBookingWindow, planMachines, summarizeMachinesNoFit } from '../../domain/dedicated-root.ts';
import { newId } from '../../domain/ids.ts';
import type { Interval, NodeFit } from '../../domain/placer.ts';
import type { NormalizedRequest } from '../../domain/reservation-request.ts';
import { PlacementContention, tryBook } from '../allocations/placement.ts';
import { loadPlacerNodes } from '../allocations/placement-load.ts';

type Trx = Transaction<Database>;

/**
 * Books `devices[0].count` whole machines for a dedicated-root lease (`binding: 'node'`) in the
 * caller's transaction, all or nothing: machines of the pool in provision state `ready` (powered
 * off, no agent needed) whose every bookable atom and host resource is free over `window`, each
 * booked whole through the one booking path (`tryBook`: atoms try-locked and re-checked, the
 * EXCLUDE constraint, the scalar guard), one allocation per machine. The machines are booked
 * through the wipe after the lease as well (`machineBookingWindow`), the allocations over the
 * lease's window alone (what is billed). A machine lost to a
 * concurrent placement rolls the lease back to its savepoint. NoFit answers why (no counter-offer:
 * machines are leased from now). Throws PlacementContention when only concurrent placements stood
 * in the way.
 */
export async function findAndBookMachines(
  trx: Trx,
  request: NormalizedRequest,
  input: { poolId: string; window: Interval; reservationId: string },
): Promise<
  | { placed: true; fit: NodeFit; fits: NodeFit[]; topologyValue: null }
  | { placed: false; message: string; earliestStart: number | null }
> {
  const count = request.devices[0]!.count;
  const span = machineBookingWindow(input.window);
  const nodes = await loadPlacerNodes(trx, { poolId: input.poolId, deviceClass: 'gpu', horizon: span });
  const plan = planMachines(nodes, span, input.reservationId);
  if (plan.fits.length < count) {
    return { placed: false, message: summarizeMachinesNoFit(plan, count), earliestStart: null };
  }
  await sql`SAVEPOINT machine_lease`.execute(trx);
  const booked: NodeFit[] = [];
  for (const fit of plan.fits) {
    if (booked.length === count) break;
    const outcome = await tryBook(trx, {
      fit,
      window: input.window,
      bookedUntil: span.end,
      reservationId: input.reservationId,
      allocationId: newId('alloc'),
    });
    if (outcome === 'booked') booked.push(fit);
  }
  if (booked.length < count) {
    await sql`ROLLBACK TO SAVEPOINT machine_lease`.execute(trx);
    throw new PlacementContention('the free machines were being booked concurrently');
  }
  await sql`RELEASE SAVEPOINT machine_lease`.execute(trx);
  return { placed: true, fit: booked[0]!, fits: booked, topologyValue: null };
}

/**
 * What a dedicated-root lease would get now, booking nothing (capacity.preview): the first of
 * `count` free whole machines over `window`, or why there are not enough. Read-only.
 */
export async function previewMachines(
  db: Db,
  input: { poolId: string; count: number; window: Interval },
): Promise<
  | { fits: true; fit: NodeFit; window: Interval }
  | { fits: false; message: string; earliestStart: number | null; window: Interval }
> {
  const span = machineBookingWindow(input.window);
  const nodes = await loadPlacerNodes(db, { poolId: input.poolId, deviceClass: 'gpu', horizon: span });
  const plan = planMachines(nodes, span);
  if (plan.fits.length >= input.count) return { fits: true, fit: plan.fits[0]!, window: input.window };
  return {
    fits: false,
    message: summarizeMachinesNoFit(plan, input.count),
    earliestStart: null,
    window: input.window,
  };
}
