import { describe, expect, it } from 'vitest';
import { jitteredBackoffMs } from './backoff.ts';

describe('jitteredBackoffMs', () => {
  const bounds = { minMs: 4, maxMs: 250 };
  it('waits between half and all of a step that doubles from the minimum to the cap', () => {
    const steps = [4, 8, 16, 32, 64, 128, 250, 250];
    steps.forEach((step, i) => {
      for (let draw = 0; draw < 200; draw++) {
        const wait = jitteredBackoffMs(i + 1, bounds);
        expect(wait).toBeGreaterThanOrEqual(Math.floor(step / 2));
        expect(wait).toBeLessThanOrEqual(step);
      }
    });
  });
  it('stays at the cap however many failures came before', () => {
    expect(jitteredBackoffMs(10_000, bounds)).toBeLessThanOrEqual(250);
    expect(jitteredBackoffMs(10_000, bounds)).toBeGreaterThanOrEqual(125);
  });
});
