import { describe, expect, it } from 'vitest';
import { placerNode } from '../tests/support/placer-node.ts';
import { planBatch } from './batch-placer.ts';
import type { PlacementRequest, PlacerNode } from './placer.ts';

const hour = 3_600_000;

const node = (name: string, host: PlacerNode['host'] = {}): PlacerNode =>
  placerNode(name, {
    attributes: (i) => ({ index: i, nvlinkDomain: `nvl-${Math.floor(i / 4)}` }),
    node: { labels: { 'bc.dev/cap.devices.limits': 'true' }, host },
  });

const request = (count: number, vcpu = 0): PlacementRequest => ({
  deviceClass: 'gpu',
  count,
  topology: 'nvlink-all',
  resources: { vcpu, memoryGiB: 0, hugepages1Gi: 0 },
  requiredLabels: [],
});

const now = { start: hour, end: 3 * hour };

describe('the batch planner', () => {
  it('plans in the order given, each request around the ones before it, never an atom twice', () => {
    const nodes = [node('a'), node('b')];
    const plan = planBatch(nodes, [
      { id: 'r1', request: request(4), window: now },
      { id: 'r2', request: request(4), window: now },
      { id: 'r3', request: request(4), window: now },
      { id: 'r4', request: request(4), window: now },
      { id: 'r5', request: request(4), window: now },
    ]);
    expect(plan.planned.map((p) => p.id)).toEqual(['r1', 'r2', 'r3', 'r4']);
    expect(plan.unplaced).toEqual(['r5']);
    // Best fit: the second request takes the half the first left, so a whole node stays free for r3.
    expect(plan.planned[1]!.fit.nodeId).toBe(plan.planned[0]!.fit.nodeId);
    const atoms = plan.planned.flatMap((p) => p.fit.deviceIds);
    expect(new Set(atoms).size).toBe(16);
    // Each NVLink-all request stays in one domain.
    for (const p of plan.planned) {
      const domains = new Set(p.fit.deviceIds.map((d) => Math.floor(Number(d.split('gpu')[1]) / 4)));
      expect(domains.size).toBe(1);
    }
  });

  it('plans a later window on atoms an earlier window of the batch holds', () => {
    const later = { start: 3 * hour, end: 4 * hour };
    const plan = planBatch(
      [node('a')],
      [
        { id: 'now-a', request: request(4), window: now },
        { id: 'now-b', request: request(4), window: now },
        { id: 'later', request: request(4), window: later },
        { id: 'overlapping', request: request(1), window: { start: 2 * hour, end: 5 * hour } },
      ],
    );
    expect(plan.planned.map((p) => p.id)).toEqual(['now-a', 'now-b', 'later']);
    expect(plan.unplaced).toEqual(['overlapping']);
  });

  it('counts the host resources earlier plans of the batch took on a node', () => {
    const host = { vcpu: { allocatable: 10, bookings: [] } };
    const plan = planBatch(
      [node('a', host)],
      [
        { id: 'r1', request: request(2, 6), window: now },
        { id: 'r2', request: request(2, 6), window: now },
        { id: 'r3', request: request(2, 3), window: now },
      ],
    );
    expect(plan.planned.map((p) => [p.id, p.fit.resources.vcpu])).toEqual([
      ['r1', 6],
      ['r3', 3],
    ]);
    expect(plan.unplaced).toEqual(['r2']);
  });
});
