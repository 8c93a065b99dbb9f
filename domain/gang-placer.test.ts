import { describe, expect, it } from 'vitest';
import { placerNode } from '../tests/support/placer-node.ts';
import { gangBindingAction } from './gang-lifecycle.ts';
import { earliestGangStart, planGang, summarizeGangNoFit } from './gang-placer.ts';
import type { PlacementRequest, PlacerNode } from './placer.ts';
import { bindFailure, defaultTimers, type ReservationSnapshot } from './reservation-lifecycle.ts';

const hour = 3_600_000;

/** An 8-GPU node in fabric `fabric` (none: unlabelled), all GPUs booked until `busyUntil` when given. */
const node = (name: string, fabric: string | null, busyUntil?: number): PlacerNode =>
  placerNode(name, {
    bookings: () => (busyUntil ? [{ start: 0, end: busyUntil }] : []),
    node: { labels: fabric ? { 'fabric.domain': fabric } : {} },
  });

const request: PlacementRequest = {
  deviceClass: 'gpu',
  count: 8,
  topology: 'any',
  resources: { vcpu: 0, memoryGiB: 0, hugepages1Gi: 0 },
  requiredLabels: [],
};
const window = { start: hour, end: 2 * hour };
const gang = { size: 4, topologyKey: 'fabric.domain' };

describe('planGang', () => {
  it('takes the one topology value with 4 free nodes, on 4 distinct nodes', () => {
    const nodes = [
      ...['a0', 'a1', 'a2'].map((n) => node(n, 'fabric-a')),
      ...['b0', 'b1', 'b2', 'b3'].map((n) => node(n, 'fabric-b')),
      node('c0', 'fabric-c', 10 * hour),
    ];
    const plan = planGang(nodes, request, gang, window);
    expect(plan.candidates.map((c) => c.value)).toEqual(['fabric-b']);
    expect(new Set(plan.candidates[0]!.plan.fits.slice(0, 4).map((f) => f.nodeId)).size).toBe(4);
  });

  it('prefers the value with the fewest spare fitting nodes (keeps larger fabrics whole)', () => {
    const nodes = [
      ...['a0', 'a1', 'a2', 'a3', 'a4', 'a5'].map((n) => node(n, 'fabric-a')),
      ...['b0', 'b1', 'b2', 'b3'].map((n) => node(n, 'fabric-b')),
    ];
    expect(planGang(nodes, request, gang, window).candidates.map((c) => c.value)).toEqual([
      'fabric-b',
      'fabric-a',
    ]);
  });

  it('without a key, any distinct nodes of the pool', () => {
    const nodes = [node('x', null), node('y', 'fabric-a'), node('z', 'fabric-b'), node('w', null)];
    const plan = planGang(nodes, request, { size: 4 }, window);
    expect(plan.candidates).toHaveLength(1);
    expect(plan.candidates[0]!.value).toBeNull();
  });

  it('says why each value was rejected, and the unlabelled nodes', () => {
    const nodes = [
      ...['a0', 'a1', 'a2'].map((n) => node(n, 'fabric-a')),
      ...['b0', 'b1'].map((n) => node(n, 'fabric-b', 10 * hour)),
      node('b2', 'fabric-b'),
      node('u', null),
    ];
    const plan = planGang(nodes, request, gang, window);
    expect(summarizeGangNoFit(plan, request, gang)).toBe(
      'no fabric.domain value has 4 nodes that fit: fabric.domain=fabric-a: 3 of 3 nodes fit; ' +
        'fabric.domain=fabric-b: 1 of 3 nodes fit (2 lack 8 free GPUs); 1 node lacks label fabric.domain',
    );
    expect(summarizeGangNoFit(planGang(nodes, request, { size: 5 }, window), request, { size: 5 })).toBe(
      'a gang of 5 needs 5 nodes that fit: 5 of 7 nodes fit (2 lack 8 free GPUs)',
    );
  });

  it('offers the earliest start at which the whole gang fits', () => {
    const nodes = [
      ...['a0', 'a1', 'a2'].map((n) => node(n, 'fabric-a')),
      node('a3', 'fabric-a', 5 * hour),
      ...['b0', 'b1', 'b2', 'b3'].map((n) => node(n, 'fabric-b', 7 * hour)),
    ];
    expect(earliestGangStart(nodes, request, gang, hour, hour, 14 * 24 * hour)).toBe(5 * hour);
  });
});

describe('gangBindingAction', () => {
  const snapshot = (over: Partial<ReservationSnapshot>): ReservationSnapshot => ({
    id: 'rsv_1',
    tenantId: 'acme',
    poolId: 'pool_1',
    state: 'binding',
    version: 3,
    now: 100_000,
    start: 0,
    end: 10 * hour,
    leaseSeconds: null,
    leaseExpiresAt: null,
    bindAttempts: 0,
    bindDeadline: 50_000,
    pendingSince: null,
    confirmationExpiresAt: null,
    endReason: null,
    conditions: [],
    allocations: [
      { id: 'a0', nodeId: 'n0', state: 'bound', boundAt: 1, gangIndex: 0, memberAttempt: 0 },
      { id: 'a1', nodeId: 'n1', state: 'binding', boundAt: null, gangIndex: 1, memberAttempt: 0 },
    ],
    poolAvailable: true,
    timers: defaultTimers,
    summary: '',
    gangSize: 2,
    ...over,
  });

  it('re-places only the member that is not bound by the deadline', () => {
    expect(gangBindingAction(snapshot({}), bindFailure)).toEqual({
      kind: 'replaceGangMembers',
      allocationIds: ['a1'],
      reason: 'NodeDidNotBind',
      bindDeadline: 100_000 + defaultTimers.bindTimeoutMs,
    });
  });

  it('waits before the deadline, and leaves single-node reservations to the usual rules', () => {
    expect(gangBindingAction(snapshot({ bindDeadline: 200_000 }), bindFailure)).toBeNull();
    expect(gangBindingAction(snapshot({ gangSize: undefined }), bindFailure)).toBeNull();
  });

  it('fails the whole attempt once a member was re-placed twice, naming it', () => {
    const s = snapshot({});
    s.allocations[1]!.memberAttempt = 2;
    expect(gangBindingAction(s, bindFailure)).toMatchObject({
      kind: 'rebind',
      message: 'gang member 1 (node n1) did not bind after 2 re-placements (attempt 1 of 3)',
    });
  });
});
