/**
 * The workflow's state holder: the last snapshot read from PostgreSQL, what it has been asked since
 * (intents), what it remembers (memory), and the validators of its updates. Pure: no Temporal
 * calls besides ApplicationFailure, so it is unit-tested without a server.
 */
import { ApplicationFailure } from '@temporalio/common';
import type {
  LifecycleIntents,
  LifecycleMemory,
  ReservationSnapshot,
} from '../../domain/reservation-lifecycle.ts';
import { isCancellable, isRenewable, isTerminal } from '../../domain/reservation-states.ts';
import type { ReservationWorkflowInput } from './messages.ts';

function invalidState(message: string, details: Record<string, unknown> = {}): ApplicationFailure {
  return ApplicationFailure.create({
    type: 'INVALID_STATE',
    message,
    nonRetryable: true,
    details: [details],
  });
}

function invalidInput(message: string): ApplicationFailure {
  return ApplicationFailure.create({ type: 'INVALID_INPUT', message, nonRetryable: true });
}

export class LifecycleHolder {
  snapshot: ReservationSnapshot | null = null;
  intents: LifecycleIntents;
  memory: LifecycleMemory;
  /** A node report arrived (or may have): judge stored reports before the next look. */
  reportsPending: boolean;
  /** Set by every wake-up; cleared when the workflow looks again. */
  dirty = false;
  /** How many times the workflow has read the reservation (an update waits for the next look). */
  looks = 0;
  /** The state last published as the ComputeState search attribute. */
  lastState: string | null;

  constructor(carried?: ReservationWorkflowInput['carried']) {
    this.intents = {
      release: carried?.release ?? false,
      cancel: carried?.cancel ?? false,
      confirmation: carried?.confirmation ?? null,
      capacityFreed: false,
    };
    this.memory = {
      lastPlaceAttemptAt: carried?.lastPlaceAttemptAt ?? null,
      meteredThrough: carried?.meteredThrough ?? null,
      ...(carried?.repairsDone ? { repairsDone: carried.repairsDone } : {}),
    };
    this.lastState = carried?.lastState ?? null;
    this.reportsPending = carried?.reportsPending ?? true;
  }

  wake(): void {
    this.dirty = true;
  }

  /** Takes a new look; answers whether the state changed since the last one published. */
  observe(snapshot: ReservationSnapshot): boolean {
    this.snapshot = snapshot;
    this.looks += 1;
    const changed = snapshot.state !== this.lastState;
    this.lastState = snapshot.state;
    return changed;
  }

  get state(): string | null {
    return this.snapshot?.state ?? null;
  }

  terminal(): boolean {
    return this.snapshot !== null && isTerminal(this.snapshot.state);
  }

  /** Whether an allocation belongs to the current placement (reports about others are ignored). */
  owns(allocationId: string): boolean {
    return this.snapshot?.allocations.some((a) => a.id === allocationId) ?? false;
  }

  /** What continue-as-new carries. */
  carried(): NonNullable<ReservationWorkflowInput['carried']> {
    return {
      lastPlaceAttemptAt: this.memory.lastPlaceAttemptAt,
      meteredThrough: this.memory.meteredThrough,
      release: this.intents.release,
      cancel: this.intents.cancel,
      confirmation: this.intents.confirmation,
      lastState: this.lastState,
      reportsPending: this.reportsPending,
      ...(this.memory.repairsDone ? { repairsDone: this.memory.repairsDone } : {}),
    };
  }

  private requireLive(action: string): void {
    if (this.snapshot && isTerminal(this.snapshot.state)) {
      throw invalidState(`cannot ${action} a ${this.snapshot.state} reservation`, {
        state: this.snapshot.state,
      });
    }
  }

  validateRelease(): void {
    this.requireLive('release');
  }

  /** Whether a cancel can still apply (the reservation has not started). */
  cancellable(): boolean {
    return this.snapshot === null || isCancellable(this.snapshot.state);
  }

  validateCancel(): void {
    this.requireLive('cancel');
    if (this.snapshot && !isCancellable(this.snapshot.state)) {
      throw invalidState(
        `only a reservation that has not started can be cancelled; it is ${this.snapshot.state}`,
        {
          state: this.snapshot.state,
        },
      );
    }
  }

  validateRenew(): void {
    this.requireLive('renew');
    if (!this.snapshot) return;
    if (this.snapshot.leaseSeconds === null)
      throw invalidState('the reservation was created without leaseSeconds');
    if (!isRenewable(this.snapshot.state)) {
      throw invalidState(`a lease renews in placed, binding or active; it is ${this.snapshot.state}`, {
        state: this.snapshot.state,
      });
    }
  }

  validateExtended(input: { end: number } | undefined): void {
    if (!input || typeof input.end !== 'number' || !Number.isFinite(input.end) || input.end <= 0) {
      throw invalidInput('extended needs the new end in epoch milliseconds');
    }
    this.requireLive('extend');
  }

  validateConfirmation(input: { decision: string } | undefined): void {
    if (!input || (input.decision !== 'approved' && input.decision !== 'denied')) {
      throw invalidInput('a confirmation decision is approved or denied');
    }
    this.requireLive('confirm');
    if (this.snapshot && this.snapshot.state !== 'awaiting-confirmation') {
      throw invalidState(`the reservation is not awaiting confirmation; it is ${this.snapshot.state}`, {
        state: this.snapshot.state,
      });
    }
  }
}
