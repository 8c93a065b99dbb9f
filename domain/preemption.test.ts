import { describe, expect, it } from 'vitest';
import { placerNode } from '../tests/support/placer-node.ts';
import { reservationSnapshot } from '../tests/support/reservation-snapshot.ts';
import type { PlacementRequest, PlacerNode } from './placer.ts';
import { choosePreemption, type SpotHolding, shouldPreempt, spotNoticeMs } from './preemption.ts';
import { decide, preemptionBackstopMs } from './reservation-lifecycle.ts';

const hour = 3_600_000;
const window = { start: 2 * hour, end: 4 * hour };

const node = (name: string, gpus = 4): PlacerNode => placerNode(name, { gpus });

/** Books `gpus` of `n` for a spot reservation over [0, 10h) and answers its holding. */
function spot(
  n: PlacerNode,
  reservationId: string,
  gpus: number[],
  startedAt: number,
  started = true,
): SpotHolding {
  const interval = { start: 0, end: 10 * hour };
  for (const i of gpus) n.devices[i]!.bookings.push(interval);
  return {
    reservationId,
    nodeId: n.id,
    started,
    startedAt,
    deviceIds: gpus.map((i) => n.devices[i]!.id),
    interval,
    resources: {},
  };
}

const request = (count: number): PlacementRequest => ({
  deviceClass: 'gpu',
  count,
  topology: 'any',
  resources: { vcpu: 0, memoryGiB: 0, hugepages1Gi: 0 },
  requiredLabels: [],
});

describe('choosePreemption', () => {
  it('chooses the fewest reservations, then the most recently started', () => {
    const a = node('a');
    const b = node('b');
    const holdings = [
      spot(a, 'rsv_a1', [0], 1),
      spot(a, 'rsv_a2', [1], 2),
      spot(a, 'rsv_a3', [2, 3], 3),
      spot(b, 'rsv_b1', [0, 1], 10),
      spot(b, 'rsv_b2', [2, 3], 5),
    ];
    const choice = choosePreemption({ nodes: [a, b], holdings, request: request(2), window });
    // One reservation suffices on both nodes; rsv_b1 started most recently.
    expect(choice).toMatchObject({ nodeId: 'node_b', reservationIds: ['rsv_b1'], noticed: ['rsv_b1'] });
    const four = choosePreemption({ nodes: [a, b], holdings, request: request(4), window });
    expect(four?.reservationIds).toEqual(['rsv_b1', 'rsv_b2']);
  });

  it('answers null when no set of spot reservations makes it fit', () => {
    const a = node('a', 2);
    const holdings = [spot(a, 'rsv_1', [0], 1)];
    a.devices[1]!.bookings.push({ start: 0, end: 10 * hour }); // a regular reservation's
    expect(choosePreemption({ nodes: [a], holdings, request: request(2), window })).toBeNull();
  });

  it('takes the early window when nothing chosen had started', () => {
    const a = node('a', 2);
    const holdings = [spot(a, 'rsv_1', [0, 1], 1, false)];
    const early = { start: hour, end: 3 * hour };
    const choice = choosePreemption({
      nodes: [a],
      holdings,
      request: request(2),
      window,
      earlyWindow: early,
    });
    expect(choice).toMatchObject({ noticed: [], window: early });
  });
});

describe('shouldPreempt and the notice', () => {
  it('never for spot, and not when waiting within the notice suffices', () => {
    expect(shouldPreempt({ spot: true, earliestStart: null, deadline: 10 })).toBe(false);
    expect(shouldPreempt({ spot: false, earliestStart: 5, deadline: 10 })).toBe(false);
    expect(shouldPreempt({ spot: false, earliestStart: 10, deadline: 10 })).toBe(false);
    expect(shouldPreempt({ spot: false, earliestStart: 11, deadline: 10 })).toBe(true);
    expect(shouldPreempt({ spot: false, earliestStart: null, deadline: 10 })).toBe(true);
  });

  it('reads spot.noticeSeconds from the pool policy, 120 s by default', () => {
    expect(spotNoticeMs({})).toBe(120_000);
    expect(spotNoticeMs({ spot: { noticeSeconds: 30 } })).toBe(30_000);
    expect(spotNoticeMs({ spot: { noticeSeconds: 'x' } })).toBe(120_000);
  });
});

describe('the lifecycle of a spot reservation under notice', () => {
  const intents = { release: false, cancel: false, confirmation: null, capacityFreed: false };
  const memory = { lastPlaceAttemptAt: null, meteredThrough: 0 };
  const bound = { id: 'alloc_1', nodeId: 'node_1', state: 'bound' as const, boundAt: 0 };
  const active = (now: number) =>
    reservationSnapshot({
      state: 'active',
      now,
      start: 0,
      end: 10_000,
      preemptAt: 10_000,
      allocations: [bound],
    });

  it('leaves the release at the deadline to the preemption workflow, and backs it up a minute later', () => {
    expect(decide(active(5_000), intents, memory)).toMatchObject({ kind: 'wait', until: 10_000 });
    expect(decide(active(10_000), intents, memory)).toEqual({
      kind: 'wait',
      until: 10_000 + preemptionBackstopMs,
      reason: 'preemption',
    });
    expect(decide(active(10_000 + preemptionBackstopMs), intents, memory)).toEqual({
      kind: 'end',
      state: 'released',
      reason: 'preempted',
    });
  });
});
