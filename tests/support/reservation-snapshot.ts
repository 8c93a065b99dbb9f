import { defaultTimers, type ReservationSnapshot } from '../../domain/reservation-lifecycle.ts';

/**
 * A lifecycle snapshot for pure tests of `decide()` and the workflow's state holder: a reservation
 * with no window, lease, allocation or condition, in `placed` at time 0, with `over` laid on top.
 */
export function reservationSnapshot(over: Partial<ReservationSnapshot> = {}): ReservationSnapshot {
  return {
    id: 'rsv_1',
    tenantId: 'acme',
    poolId: 'pool_1',
    state: 'placed',
    version: 1,
    now: 0,
    start: null,
    end: null,
    leaseSeconds: null,
    leaseExpiresAt: null,
    bindAttempts: 0,
    bindDeadline: null,
    pendingSince: null,
    confirmationExpiresAt: null,
    endReason: null,
    conditions: [],
    allocations: [],
    poolAvailable: true,
    timers: defaultTimers,
    summary: 'test',
    ...over,
  };
}
