import { sql, type Transaction } from 'kysely';
import type { Database, Reservation } from '../../core/database.ts';
import type { Condition } from '../../domain/reservation-lifecycle.ts';
import { moveAllocationEnds } from '../allocations/move-ends.ts';
import { updateReservation } from './lifecycle.ts';
import { recordReservationEvent } from './lifecycle-events.ts';
import { assignReservationDevices } from './lifecycle-nodespec.ts';

type Trx = Transaction<Database>;

/** A spot reservation whose notice a released or cancelled preemptor called off. */
export interface CalledOffPreemption {
  reservationId: string;
  /** Whether its bookings got their original end back; false: it is still released at the deadline. */
  restored: boolean;
  deadline: number;
}

/**
 * Calls off the preemptions a regular reservation made, in the caller's transaction, after its
 * own bookings were ended (releaseReservation, a lifecycle's end): every spot reservation still
 * under a notice it gave, and before that notice's deadline, is locked in id order and gets its
 * bookings back to the end it had (moveAllocationEnds: the EXCLUDE constraint referees), its
 * window too; the `Preempted` condition and the notice are cleared, its node's NodeSpec loses
 * `preemptAt`, and `reservation.preemption-called-off` is written. One whose capacity was taken
 * since (or without a recorded original end) keeps its notice and is released at the deadline as
 * announced (`restored: false`). Past the deadline nothing changes. Idempotent: a second call
 * finds no notice of this preemptor.
 */
export async function callOffPreemptionsBy(trx: Trx, preemptorId: string): Promise<CalledOffPreemption[]> {
  const { rows } = await sql<Reservation & { now: Date }>`
    SELECT r.*, compute_now() AS now FROM reservations r
    WHERE r.preempt_notice_until IS NOT NULL AND r.preempt_notice_until > compute_now()
      AND r.state IN ('placed', 'binding', 'active')
      AND EXISTS (SELECT 1 FROM jsonb_array_elements(r.conditions) c
                  WHERE c->>'type' = 'Preempted' AND c->>'preemptedBy' = ${preemptorId})
    ORDER BY r.id FOR UPDATE OF r`.execute(trx);
  const out: CalledOffPreemption[] = [];
  for (const spot of rows) {
    const deadline = new Date(spot.preempt_notice_until!).getTime();
    const condition = ((spot.conditions ?? []) as Array<Condition & { originalEnd?: number }>).find(
      (c) => c.type === 'Preempted',
    );
    const originalEnd = condition?.originalEnd;
    const moved =
      originalEnd !== undefined && originalEnd > deadline
        ? await moveAllocationEnds(trx, { reservationId: spot.id, currentEnd: deadline, newEnd: originalEnd })
        : { moved: false as const };
    if (!moved.moved) {
      out.push({ reservationId: spot.id, restored: false, deadline });
      continue;
    }
    const end = new Date(originalEnd!).toISOString();
    await sql`UPDATE reservations SET during = tstzrange(lower(during), ${end}::timestamptz, '[)'), preempt_notice_until = NULL
      WHERE id = ${spot.id}`.execute(trx);
    await updateReservation(trx, spot.id, {
      conditions: (spot.conditions as Condition[]).filter((c) => c.type !== 'Preempted'),
    });
    if (spot.state !== 'placed') {
      await assignReservationDevices(
        trx,
        spot.id,
        spot.binding_kind === 'kubernetes' ? 'kubernetes' : 'hold',
      );
    }
    await recordReservationEvent(trx, spot, 'reservation.preemption-called-off', spot.state, {
      preemptedBy: preemptorId,
      deadline,
      end: originalEnd,
    });
    out.push({ reservationId: spot.id, restored: true, deadline });
  }
  return out;
}
