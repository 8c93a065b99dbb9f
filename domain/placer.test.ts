import { describe, expect, it } from 'vitest';
import { placerNode } from '../tests/support/placer-node.ts';
import {
  candidateStarts,
  earliestStart,
  fitNode,
  type PlacementRequest,
  type PlacerNode,
  planPlacement,
  summarizeNoFit,
} from './placer.ts';

const hour = 3_600_000;

function node(
  name: string,
  options: Partial<PlacerNode> & { booked?: number[]; domains?: number } = {},
): PlacerNode {
  const { booked, domains = 1, ...overrides } = options;
  return placerNode(name, {
    attributes: (i) => ({ index: i, nvlinkDomain: `nvl-${Math.floor((i * domains) / 8)}`, model: 'h100' }),
    bookings: (i) => (booked?.includes(i) ? [{ start: 0, end: 10 * hour }] : []),
    node: { labels: { 'bc.dev/cap.devices.limits': 'true' }, ...overrides },
  });
}

const request = (extra: Partial<PlacementRequest> = {}): PlacementRequest => ({
  deviceClass: 'gpu',
  count: 4,
  topology: 'nvlink-all',
  resources: { vcpu: 0, memoryGiB: 0, hugepages1Gi: 0 },
  requiredLabels: [],
  ...extra,
});

const window = { start: hour, end: 2 * hour };

describe('the placer', () => {
  it('prefers the tightest fit so whole nodes stay free', () => {
    const plan = planPlacement(
      [node('a'), node('b', { booked: [0, 1, 2, 3] }), node('c', { booked: [0] })],
      request(),
      window,
    );
    expect(plan.fits.map((f) => f.nodeName)).toEqual(['b', 'c', 'a']);
    expect(plan.fits[0]!.deviceIds).toEqual(['b-gpu4', 'b-gpu5', 'b-gpu6', 'b-gpu7']);
  });

  it('keeps nvlink-all in one NVLink domain and lets any topology span domains', () => {
    const split = node('s', { domains: 2, booked: [0, 4] });
    expect(planPlacement([split], request(), window).fits).toEqual([]);
    expect(planPlacement([split], request({ topology: 'any' }), window).fits[0]!.deviceIds).toHaveLength(4);
  });

  it('ignores bookings outside the window', () => {
    const later = { start: 11 * hour, end: 12 * hour };
    expect(
      planPlacement([node('x', { booked: [0, 1, 2, 3, 4, 5, 6, 7] })], request(), later).fits,
    ).toHaveLength(1);
  });

  it('summarizes why nothing fits, largest reason first', () => {
    const nodes = [
      ...Array.from({ length: 9 }, (_, i) => node(`full${i}`, { booked: [0, 1, 2, 3, 4] })),
      ...Array.from({ length: 3 }, (_, i) => node(`cordoned${i}`, { cordoned: true })),
    ];
    const plan = planPlacement(nodes, request(), window);
    expect(summarizeNoFit(plan, request())).toBe(
      '0 of 12 nodes fit: 9 lack 4 free GPUs in one NVLink domain, 3 are cordoned',
    );
    const one = planPlacement([node('m', { maintenance: true })], request({ count: 1 }), window);
    expect(summarizeNoFit(one, request({ count: 1 }))).toBe('0 of 1 node fit: 1 is in maintenance');
    expect(summarizeNoFit(planPlacement([], request(), window), request())).toBe(
      '0 of 0 nodes fit: the pool has no nodes',
    );
  });

  it('checks schedulability, labels, selectors and host resources', () => {
    const withHost = node('h', {
      host: { vcpu: { allocatable: 32, bookings: [{ start: 0, end: 10 * hour, amount: 24 }] } },
    });
    const needsCpu = request({ resources: { vcpu: 16, memoryGiB: 0, hugepages1Gi: 0 } });
    expect(planPlacement([withHost], needsCpu, window).rejections).toEqual({ 'host-resources': 1 });
    const unlabeled = { ...withHost, labels: {} };
    const plan = planPlacement([unlabeled], needsCpu, window);
    expect(summarizeNoFit(plan, needsCpu)).toBe('0 of 1 node fit: 1 lacks label bc.dev/cap.devices.limits=*');
    const selector = request({ selector: { attributes: { model: 'a100' } } });
    expect(planPlacement([node('a')], selector, window).rejections).toEqual({ selector: 1 });
    for (const broken of [
      { ready: false },
      { connected: false },
      { converged: false },
      { noSchedule: 'GpuCountMismatch' },
      { draining: true },
    ]) {
      expect(planPlacement([node('z', broken)], request(), window).fits).toEqual([]);
    }
  });

  it('finds the earliest start from booking ends within the horizon', () => {
    const busy = node('busy', { booked: [0, 1, 2, 3, 4, 5, 6, 7] });
    expect(earliestStart([busy], request(), hour, hour, 14 * 24 * hour)).toBe(10 * hour);
    expect(earliestStart([busy], request(), hour, hour, 5 * hour)).toBeNull();
    expect(earliestStart([node('free')], request(), hour, hour, 5 * hour)).toBe(hour);
  });

  it("finds, node by node, the same earliest start as trying every node at every instant of the pool's bookings", () => {
    // The reference: every instant of every node's bookings, in order, each tried on every node.
    const everyNodeEveryInstant = (
      nodes: PlacerNode[],
      r: PlacementRequest,
      durationMs: number,
      from: number,
    ) => {
      for (const start of candidateStarts(nodes, from, 14 * 24 * hour, 10_000)) {
        if (nodes.some((n) => 'fit' in fitNode(n, r, { start, end: start + durationMs }))) return start;
      }
      return null;
    };
    let seed = 7;
    const random = () => {
      seed = (seed * 1_103_515_245 + 12_345) % 2_147_483_648;
      return seed / 2_147_483_648;
    };
    const int = (n: number) => Math.floor(random() * n);
    const span = () => {
      const start = int(72) * hour + int(4) * 900_000;
      return { start, end: start + (1 + int(30)) * hour };
    };
    let found = 0;
    for (let round = 0; round < 3_000; round++) {
      const nodes = Array.from({ length: 1 + int(5) }, (_, n) => {
        const domains = 1 + int(2);
        const base = placerNode(`n${n}`, {
          attributes: (i) => ({ index: i, nvlinkDomain: `nvl-${Math.floor((i * domains) / 8)}` }),
          bookings: () => Array.from({ length: int(3) }, span),
        });
        if (random() < 0.5)
          base.host = {
            vcpu: {
              allocatable: 64,
              bookings: Array.from({ length: int(4) }, () => ({ ...span(), amount: 16 * (1 + int(3)) })),
            },
          };
        return base;
      });
      const r = request({
        count: 1 + int(8),
        topology: random() < 0.5 ? 'nvlink-all' : 'any',
        resources: { vcpu: 8 * int(6), memoryGiB: 0, hugepages1Gi: 0 },
      });
      const durationMs = (1 + int(24)) * hour;
      const from = int(10) * 1_800_000;
      const expected = everyNodeEveryInstant(nodes, r, durationMs, from);
      if (expected !== null) found++;
      expect(earliestStart(nodes, r, durationMs, from, 14 * 24 * hour)).toBe(expected);
    }
    // Both answers occur often: the cases are neither all free nor all full.
    expect(found).toBeGreaterThan(600);
    expect(found).toBeLessThan(2_900);
  });
});
