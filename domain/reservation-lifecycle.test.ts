import { describe, expect, it } from 'vitest';
import { reservationSnapshot } from '../tests/support/reservation-snapshot.ts';
import {
  decide,
  defaultTimers,
  type LifecycleIntents,
  type LifecycleMemory,
  operationState,
  type ReservationSnapshot,
} from './reservation-lifecycle.ts';

const now = Date.UTC(2031, 0, 1, 12);
const none: LifecycleIntents = { release: false, cancel: false, confirmation: null, capacityFreed: false };
const memory: LifecycleMemory = { lastPlaceAttemptAt: null, meteredThrough: null };

function snapshot(over: Partial<ReservationSnapshot>): ReservationSnapshot {
  return reservationSnapshot({
    state: 'placed',
    version: 3,
    now,
    start: now + 3_600_000,
    end: now + 7_200_000,
    allocations: [{ id: 'alloc_1', nodeId: 'node_1', state: 'planned', boundAt: null }],
    ...over,
  });
}

describe('decide', () => {
  it('waits for 15 minutes before a future start, then for the start, then binds', () => {
    // An hour ahead, the 15-minute recheck comes first; 20 minutes ahead, the look 15 minutes before.
    expect(decide(snapshot({}), none, memory)).toMatchObject({ kind: 'wait', until: now + 900_000 });
    expect(decide(snapshot({ start: now + 1_200_000 }), none, memory)).toMatchObject({
      until: now + 300_000,
    });
    expect(decide(snapshot({ start: now + 600_000 }), none, memory)).toMatchObject({
      kind: 'wait',
      until: now + 600_000,
    });
    expect(decide(snapshot({ start: now }), none, memory)).toEqual({
      kind: 'beginBinding',
      bindDeadline: now + 300_000,
    });
  });

  it('activates once every allocation is bound, re-places on failure, and fails at the third', () => {
    const binding = { state: 'binding' as const, start: now - 1, bindDeadline: now + 1_000 };
    const bound = [{ id: 'alloc_1', nodeId: 'node_1', state: 'bound' as const, boundAt: now }];
    expect(decide(snapshot({ ...binding, allocations: bound }), none, memory)).toEqual({ kind: 'activate' });
    expect(decide(snapshot({ ...binding, bindDeadline: now }), none, memory)).toMatchObject({
      kind: 'rebind',
      reason: 'NodeDidNotBind',
    });
    expect(decide(snapshot({ ...binding, bindDeadline: now, bindAttempts: 2 }), none, memory)).toMatchObject({
      kind: 'end',
      state: 'failed',
      condition: { type: 'BindTimeout', reason: 'NodeDidNotBind' },
    });
  });

  it('ends with lease-lapsed before expired, and a release wins over both', () => {
    const active = snapshot({
      state: 'active',
      start: now - 10,
      end: now,
      leaseExpiresAt: now,
      allocations: [{ id: 'alloc_1', nodeId: 'node_1', state: 'bound', boundAt: now - 10 }],
    });
    expect(decide(active, none, memory)).toMatchObject({
      kind: 'end',
      state: 'released',
      reason: 'lease-lapsed',
    });
    expect(decide({ ...active, leaseExpiresAt: null }, none, memory)).toMatchObject({ reason: 'expired' });
    expect(decide(active, { ...none, release: true }, memory)).toMatchObject({ reason: 'release' });
  });

  it('retries a pending reservation every pendingRetry, at once when capacity frees, and fails past maxPending', () => {
    const pending = snapshot({
      state: 'pending',
      start: null,
      end: null,
      allocations: [],
      pendingSince: now - 1_000,
    });
    expect(decide(pending, none, memory)).toEqual({ kind: 'place' });
    const tried = { ...memory, lastPlaceAttemptAt: now - 1_000 };
    expect(decide(pending, none, tried)).toMatchObject({ kind: 'wait', until: now + 29_000 });
    expect(decide(pending, { ...none, capacityFreed: true }, tried)).toEqual({ kind: 'place' });
    expect(decide({ ...pending, pendingSince: now - defaultTimers.maxPendingMs }, none, tried)).toMatchObject(
      {
        kind: 'end',
        state: 'failed',
        condition: { reason: 'MaxPendingExceeded' },
      },
    );
    expect(decide({ ...pending, poolAvailable: false }, none, tried)).toMatchObject({
      condition: { reason: 'PoolGone' },
    });
  });

  it('leaves a Queued reservation to the pool-lease placer: it waits, but still cancels and fails past maxPending', () => {
    const queued = snapshot({
      state: 'pending',
      start: null,
      end: null,
      allocations: [],
      pendingSince: now - 1_000,
      conditions: [{ type: 'Queued', reason: 'PoolPlacer', message: 'waiting for the pool placer' }],
    });
    expect(decide(queued, none, memory)).toMatchObject({ kind: 'wait', reason: 'queued' });
    expect(decide(queued, { ...none, capacityFreed: true }, memory)).toMatchObject({ kind: 'wait' });
    expect(decide(queued, { ...none, cancel: true }, memory)).toMatchObject({
      kind: 'end',
      state: 'cancelled',
    });
    expect(decide({ ...queued, pendingSince: now - defaultTimers.maxPendingMs }, none, memory)).toMatchObject(
      { kind: 'end', condition: { reason: 'MaxPendingExceeded' } },
    );
  });

  it('expires an unconfirmed reservation at its deadline and denies a refused one', () => {
    const waiting = snapshot({
      state: 'awaiting-confirmation',
      allocations: [],
      confirmationExpiresAt: now + 5,
    });
    expect(decide(waiting, none, memory)).toMatchObject({ kind: 'wait', until: now + 5 });
    expect(decide({ ...waiting, confirmationExpiresAt: now }, none, memory)).toMatchObject({
      state: 'expired',
    });
    expect(decide(waiting, { ...none, confirmation: 'denied' }, memory)).toMatchObject({ state: 'denied' });
  });

  it('raises and clears Degraded/BindingLost, and meters usage at each window boundary', () => {
    const active = snapshot({ state: 'active', start: now - 10, end: now + 7_200_000 });
    const lost = decide(
      { ...active, allocations: [{ id: 'a', nodeId: 'n', state: 'released', boundAt: 1 }] },
      none,
      memory,
    );
    expect(lost).toMatchObject({
      kind: 'setConditions',
      conditions: [{ type: 'Degraded', reason: 'BindingLost' }],
    });
    const healed = decide(
      {
        ...active,
        conditions: [{ type: 'Degraded', reason: 'BindingLost', message: '' }],
        allocations: [{ id: 'a', nodeId: 'n', state: 'bound', boundAt: 1 }],
      },
      none,
      memory,
    );
    expect(healed).toEqual({ kind: 'setConditions', conditions: [] });
    const bound = { ...active, allocations: [{ id: 'a', nodeId: 'n', state: 'bound' as const, boundAt: 1 }] };
    expect(decide(bound, none, { ...memory, meteredThrough: now - 3_600_000 })).toEqual({
      kind: 'meterUsage',
    });
  });

  it('maps states to operation states', () => {
    expect(operationState('pending', [{ type: 'Queued', reason: 'PoolPlacer', message: '' }])).toBe(
      'running',
    );
    expect(operationState('pending', [])).toBe('pending');
    expect(operationState('active', [])).toBe('succeeded');
    expect(operationState('expired', [])).toBe('failed');
  });

  it('shows node health on an active reservation: BindingLost wins over ForeignGpuExposure over AtomUnhealthy', () => {
    const active = snapshot({ state: 'active', start: now - 10, end: now + 7_200_000 });
    const bound = { id: 'a', nodeId: 'node_b', state: 'bound' as const, boundAt: 1 };
    const sick = decide(
      {
        ...active,
        allocations: [
          { ...bound, unhealthyAtoms: ['GPU-2'], nodeUnreachable: true },
          { ...bound, id: 'b', nodeId: 'node_a', foreignGpuExposure: true },
        ],
      },
      none,
      memory,
    );
    expect(sick).toMatchObject({
      kind: 'setConditions',
      conditions: [
        { type: 'Degraded', reason: 'ForeignGpuExposure', message: expect.stringContaining('node_a') },
        { type: 'NodeUnreachable', reason: 'Unreachable', message: 'not connected: node_b' },
      ],
    });
    const unhealthy = decide(
      { ...active, allocations: [{ ...bound, unhealthyAtoms: ['GPU-2'] }] },
      none,
      memory,
    );
    expect(unhealthy).toMatchObject({
      conditions: [{ reason: 'AtomUnhealthy', message: 'unhealthy: GPU-2' }],
    });
  });

  it('re-assigns the devices when an extend moved the end past what the node holds', () => {
    const active = snapshot({
      state: 'active',
      start: now - 10,
      end: now + 7_200_000,
      allocations: [
        {
          id: 'a',
          nodeId: 'n',
          state: 'bound',
          boundAt: 1,
          until: now + 7_200_000,
          assignedUntil: now + 3_600_000,
        },
      ],
    });
    expect(decide(active, none, memory)).toEqual({ kind: 'syncAssignments' });
    const synced = {
      ...active,
      allocations: [{ ...active.allocations[0]!, assignedUntil: now + 7_200_000 }],
    };
    expect(decide(synced, none, memory)).toMatchObject({ kind: 'wait' });
  });
});
