/**
 * A capped exponential backoff with equal jitter: the step doubles from `minMs` with each failure
 * (the first failure waits about `minMs`) up to `maxMs`, and the wait is half the step plus up to
 * as much again at random, so callers failing together come back spread out.
 */
export function jitteredBackoffMs(failures: number, bounds: { minMs: number; maxMs: number }): number {
  const step = Math.min(bounds.maxMs, bounds.minMs * 2 ** Math.min(Math.max(failures - 1, 0), 30));
  return Math.floor(step / 2 + Math.random() * (step / 2));
}
