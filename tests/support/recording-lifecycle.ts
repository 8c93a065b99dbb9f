import type { LifecycleSignal, ReservationLifecycle } from '../../core/deps.ts';

/**
 * The lifecycle seam as a recorder: what admission or the gateway asked of the lifecycle, for tests
 * that run without Temporal (not a stand-in for the workflows' behaviour).
 */
export class RecordingLifecycle implements ReservationLifecycle {
  readonly started: Array<{ id: string; state: string }> = [];
  readonly signals: Array<{ reservationId: string; signal: LifecycleSignal }> = [];
  readonly wokenPools: string[] = [];

  async start(reservation: { id: string; state: string }): Promise<void> {
    this.started.push({ id: reservation.id, state: reservation.state });
  }

  /** The ids of `reservationIds` whose start was recorded. */
  async running(reservationIds: string[]): Promise<Set<string>> {
    return new Set(this.started.map((r) => r.id).filter((id) => reservationIds.includes(id)));
  }

  async signal(reservationId: string, signal: LifecycleSignal): Promise<void> {
    this.signals.push({ reservationId, signal });
  }

  async wakePool(poolId: string): Promise<void> {
    this.wokenPools.push(poolId);
  }
}
