import { describe, expect, it } from 'vitest';
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
