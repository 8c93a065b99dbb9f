import { ApplicationFailure } from '@temporalio/common';
import { describe, expect, it } from 'vitest';
import type { ReservationSnapshot } from '../../domain/reservation-lifecycle.ts';
import { reservationSnapshot } from '../../tests/support/reservation-snapshot.ts';
import { LifecycleHolder } from './state.ts';

function snapshot(over: Partial<ReservationSnapshot>): ReservationSnapshot {
  return reservationSnapshot({
    state: 'active',
    start: 0,
    end: 10,
    leaseSeconds: 60,
    leaseExpiresAt: 60_000,
    allocations: [{ id: 'alloc_1', nodeId: 'node_1', state: 'bound', boundAt: 0 }],
    ...over,
  });
}

function codeOf(fn: () => void): string | undefined {
  try {
    fn();
    return undefined;
  } catch (error) {
    return error instanceof ApplicationFailure ? (error.type ?? undefined) : 'not an ApplicationFailure';
  }
}

describe('the lifecycle state holder', () => {
  it('refuses updates a terminal reservation cannot take, with INVALID_STATE', () => {
    const holder = new LifecycleHolder();
    holder.observe(snapshot({ state: 'released' }));
    expect(codeOf(() => holder.validateRelease())).toBe('INVALID_STATE');
    expect(codeOf(() => holder.validateRenew())).toBe('INVALID_STATE');
    expect(codeOf(() => holder.validateExtended({ end: 20 }))).toBe('INVALID_STATE');
  });

  it('allows cancel only before the start, renew only with a lease, confirmation only while awaiting it', () => {
    const holder = new LifecycleHolder();
    holder.observe(snapshot({ state: 'active' }));
    expect(codeOf(() => holder.validateCancel())).toBe('INVALID_STATE');
    expect(codeOf(() => holder.validateRenew())).toBeUndefined();
    expect(codeOf(() => holder.validateConfirmation({ decision: 'approved' }))).toBe('INVALID_STATE');
    holder.observe(snapshot({ state: 'placed', leaseSeconds: null }));
    expect(codeOf(() => holder.validateCancel())).toBeUndefined();
    expect(codeOf(() => holder.validateRenew())).toBe('INVALID_STATE');
    holder.observe(snapshot({ state: 'awaiting-confirmation' }));
    expect(codeOf(() => holder.validateConfirmation({ decision: 'maybe' }))).toBe('INVALID_INPUT');
    expect(codeOf(() => holder.validateConfirmation({ decision: 'denied' }))).toBeUndefined();
    expect(codeOf(() => holder.validateExtended({ end: Number.NaN }))).toBe('INVALID_INPUT');
  });

  it('owns only the current placement, and carries intents and memory across continue-as-new', () => {
    const holder = new LifecycleHolder();
    holder.observe(snapshot({}));
    expect(holder.owns('alloc_1')).toBe(true);
    expect(holder.owns('alloc_other')).toBe(false);
    holder.intents.release = true;
    holder.memory.meteredThrough = 42;
    const next = new LifecycleHolder(holder.carried());
    expect(next.intents.release).toBe(true);
    expect(next.memory.meteredThrough).toBe(42);
    expect(next.lastState).toBe('active');
  });
});
