import { describe, expect, it } from 'vitest';
import { reservationSnapshot } from '../tests/support/reservation-snapshot.ts';
import { releaseCarryLimitMs, releaseCarryStepMs } from './kubernetes-release.ts';
import { decide, type LifecycleIntents, type ReservationSnapshot } from './reservation-lifecycle.ts';

const hour = 3_600_000;
const end = Date.UTC(2031, 0, 1, 12);
const none: LifecycleIntents = { release: false, cancel: false, confirmation: null, capacityFreed: false };

function releasing(now: number, over: Partial<ReservationSnapshot['allocations'][number]> = {}) {
  return reservationSnapshot({
    state: 'releasing',
    now,
    end,
    endReason: 'release',
    allocations: [
      {
        id: 'alloc_1',
        nodeId: 'node_1',
        state: 'releasing',
        boundAt: end - 2 * hour,
        until: end,
        bookedUntil: end,
        ...over,
      },
    ],
  });
}
const memory = (meteredThrough: number) => ({ lastPlaceAttemptAt: null, meteredThrough });

describe('a held kubernetes release', () => {
  it('waits while pods hold the GPUs before the end, and finishes once the node reported them free', () => {
    const now = end - hour / 2;
    expect(decide(releasing(now), none, memory(now))).toMatchObject({ kind: 'wait', reason: 'devices-held' });
    expect(decide(releasing(now, { state: 'released' }), none, memory(now))).toEqual({
      kind: 'finishRelease',
      forced: null,
    });
  });

  it('carries the booking 5 minutes on a minute before it runs out, never past 24 hours after the end', () => {
    expect(decide(releasing(end - 61_000), none, memory(end - 61_000))).toMatchObject({
      kind: 'wait',
      until: end - 60_000,
    });
    expect(decide(releasing(end - 30_000), none, memory(end - 30_000))).toEqual({
      kind: 'carryRelease',
      until: end + releaseCarryStepMs,
    });
    const late = end + releaseCarryLimitMs - 2 * 60_000;
    expect(decide(releasing(late, { bookedUntil: late + 30_000 }), none, memory(late))).toEqual({
      kind: 'carryRelease',
      until: end + releaseCarryLimitMs,
    });
  });

  it('is forced at 24 hours past the allocation end', () => {
    const at = end + releaseCarryLimitMs;
    expect(decide(releasing(at, { bookedUntil: at }), none, memory(at))).toEqual({
      kind: 'finishRelease',
      forced: 'carry-limit',
    });
  });
});
