import { afterEach, describe, expect, it, vi } from 'vitest';
import type { PlacerNode } from '../domain/placer.ts';
import { placerNode } from '../tests/support/placer-node.ts';
import { PlacerNodeCache } from './placer-node-cache.ts';

describe('PlacerNodeCache claims', () => {
  it('marks a node while any of its claims is held, per pool', () => {
    const cache = new PlacerNodeCache();
    const first = cache.claim('pool-a', 'node-1');
    const second = cache.claim('pool-a', 'node-1');
    expect(cache.claimed('pool-a', 'node-1')).toBe(true);
    expect(cache.claimed('pool-b', 'node-1')).toBe(false);
    expect(cache.claimed('pool-a', 'node-2')).toBe(false);
    first();
    first();
    expect(cache.claimed('pool-a', 'node-1')).toBe(true);
    second();
    expect(cache.claimed('pool-a', 'node-1')).toBe(false);
  });
});

describe('PlacerNodeCache room', () => {
  const window = { start: 1_000_000, end: 1_000_000 + 3_600_000 };
  const horizon = { start: window.start, end: window.end + 86_400_000 };
  const node = (id: string, free: number): PlacerNode => {
    const n = placerNode(id, { bookings: (i) => (i < free ? [] : [window]) });
    return { ...n, id, devices: n.devices.map((d, i) => ({ ...d, id: `${id}-gpu${i}` })) };
  };
  const free = (n: PlacerNode, w: typeof window) =>
    n.devices.filter((d) => !d.bookings.some((b) => b.start < w.end && w.start < b.end)).length;

  async function shared(cache: PlacerNodeCache, nodes: PlacerNode[]) {
    cache.shareWholeRead(
      'pool',
      'gpu',
      { startedAt: 0, horizon, window, nodes: Promise.resolve(nodes) },
      free,
    );
    await Promise.resolve();
    await Promise.resolve();
  }

  it('has no room to offer before a whole read, nor for a window far from the one read', async () => {
    const cache = new PlacerNodeCache();
    expect(cache.roomSample('pool', 'gpu', window, 1, 8)).toBeUndefined();
    await shared(cache, [node('a', 8)]);
    expect(cache.roomSample('pool', 'gpu', window, 1, 8)).toEqual(['a']);
    const later = { start: window.start + 86_400_000, end: window.end + 86_400_000 };
    expect(cache.roomSample('pool', 'gpu', later, 1, 8)).toBeUndefined();
    expect(cache.roomSample('pool', 'cpu', window, 1, 8)).toBeUndefined();
  });

  it('samples only the nodes a whole read found with enough free atoms, less the bookings since', async () => {
    const cache = new PlacerNodeCache();
    const nodes = Array.from({ length: 100 }, (_, i) => node(`n${i}`, i < 10 ? 4 : i < 20 ? 2 : 0));
    await shared(cache, nodes);
    // Cached for the samples' reads, and not made the warm nodes (a whole pool is not warm).
    expect(cache.lookup('pool', 'gpu', ['n0', 'n50'], window).cached.map((n) => n.id)).toEqual(['n0', 'n50']);
    expect(cache.warmNodes('pool')).toEqual([]);

    const roomy = new Set(Array.from({ length: 10 }, (_, i) => `n${i}`));
    for (let i = 0; i < 20; i++) {
      const sample = cache.roomSample('pool', 'gpu', window, 4, 8)!;
      expect(sample).toHaveLength(8);
      expect(new Set(sample).size).toBe(8);
      for (const id of sample) expect(roomy.has(id)).toBe(true);
    }
    expect(cache.roomSample('pool', 'gpu', window, 2, 100)).toHaveLength(20);

    // This process books 2 atoms of n0: it has 2 left; a node found changed is dropped.
    cache.recordBooking('pool', 'gpu', {
      nodeId: 'n0',
      deviceIds: ['n0-gpu0', 'n0-gpu1'],
      window,
      resources: {},
    });
    cache.forget('pool', 'gpu', 'n1');
    const four = cache.roomSample('pool', 'gpu', window, 4, 100)!;
    expect(four.sort()).toEqual(['n2', 'n3', 'n4', 'n5', 'n6', 'n7', 'n8', 'n9']);
    expect(cache.roomSample('pool', 'gpu', window, 2, 100)).toHaveLength(19);
    expect(cache.roomSample('pool', 'gpu', window, 5, 8)).toEqual([]);
  });

  it('shares a whole read while it runs, for windows its bookings cover; a failed read is shared by nobody', async () => {
    const cache = new PlacerNodeCache();
    let resolve!: (nodes: PlacerNode[]) => void;
    const running = new Promise<PlacerNode[]>((r) => {
      resolve = r;
    });
    cache.shareWholeRead('pool', 'gpu', { startedAt: 1, horizon, window, nodes: running }, free);
    expect(cache.wholeReadCovering('pool', 'gpu', window)?.nodes).toBe(running);
    expect(
      cache.wholeReadCovering('pool', 'gpu', { start: window.start, end: horizon.end + 1 }),
    ).toBeUndefined();
    resolve([node('a', 8)]);
    await running;
    await Promise.resolve();
    expect(cache.wholeReadCovering('pool', 'gpu', window)).toBeUndefined();

    const failing = Promise.reject(new Error('the transaction was aborted'));
    cache.shareWholeRead('pool', 'gpu', { startedAt: 2, horizon, window, nodes: failing }, free);
    await failing.catch(() => undefined);
    await Promise.resolve();
    expect(cache.wholeReadCovering('pool', 'gpu', window)).toBeUndefined();
    // The room of the last read that succeeded stays.
    expect(cache.roomSample('pool', 'gpu', window, 8, 8)).toEqual(['a']);
  });

  it('keeps the room of the newest whole read when an older one ends after it', async () => {
    const cache = new PlacerNodeCache();
    let resolveOld!: (nodes: PlacerNode[]) => void;
    const old = new Promise<PlacerNode[]>((r) => {
      resolveOld = r;
    });
    cache.shareWholeRead('pool', 'gpu', { startedAt: 1, horizon, window, nodes: old }, free);
    const newer = Promise.resolve([node('b', 8)]);
    cache.shareWholeRead('pool', 'gpu', { startedAt: 2, horizon, window, nodes: newer }, free);
    await newer;
    await Promise.resolve();
    resolveOld([node('a', 8)]);
    await old;
    await Promise.resolve();
    expect(cache.roomSample('pool', 'gpu', window, 1, 8)).toEqual(['b']);
  });

  it('keeps what this process read or booked since a whole read began over what that read saw', async () => {
    const cache = new PlacerNodeCache();
    cache.store('pool', 'gpu', [node('a', 8), node('b', 8)], horizon);
    const began = performance.now();
    // While the read runs, this process books 6 atoms of a; b is untouched since before it.
    cache.recordBooking('pool', 'gpu', {
      nodeId: 'a',
      deviceIds: ['a-gpu0', 'a-gpu1', 'a-gpu2', 'a-gpu3', 'a-gpu4', 'a-gpu5'],
      window,
      resources: {},
    });
    const read = Promise.resolve([node('a', 8), node('b', 3)]);
    cache.shareWholeRead('pool', 'gpu', { startedAt: began, horizon, window, nodes: read }, free);
    await read;
    await Promise.resolve();
    const [a, b] = cache.lookup('pool', 'gpu', ['a', 'b'], window).cached;
    expect(free(a!, window)).toBe(2);
    expect(free(b!, window)).toBe(3);
    expect(cache.roomSample('pool', 'gpu', window, 3, 8)).toEqual(['b']);
    expect(new Set(cache.roomSample('pool', 'gpu', window, 2, 8))).toEqual(new Set(['a', 'b']));
  });
});

describe('PlacerNodeCache entries', () => {
  afterEach(() => {
    vi.useRealTimers();
  });

  it('reuses a node read for at most the TTL, and the nodes of one read are not all read again at once', () => {
    vi.useFakeTimers({ toFake: ['Date'] });
    const cache = new PlacerNodeCache(10_000);
    const window = { start: 1_000_000, end: 1_000_000 + 3_600_000 };
    const horizon = { start: window.start, end: window.end + 86_400_000 };
    const ids = Array.from({ length: 200 }, (_, i) => `n${i}`);
    cache.store(
      'pool',
      'gpu',
      ids.map((id) => ({ ...placerNode(id), id })),
      horizon,
    );
    const missing = () => cache.lookup('pool', 'gpu', ids, window).missing.length;
    vi.advanceTimersByTime(4_999);
    expect(missing()).toBe(0);
    // Between half the TTL and the TTL each is read again, spread over that time.
    vi.advanceTimersByTime(2_500);
    expect(missing()).toBeGreaterThan(20);
    expect(missing()).toBeLessThan(180);
    vi.advanceTimersByTime(2_501);
    expect(missing()).toBe(200);
  });
});
