import { afterEach, describe, expect, it, vi } from 'vitest';
import { TtlCache } from './admission-caches.ts';

describe('TtlCache.load', () => {
  it('shares one load among concurrent callers and keeps its value', async () => {
    const cache = new TtlCache<number>(60_000);
    let loads = 0;
    let finish: (value: number) => void = () => {};
    const loader = () => {
      loads++;
      return new Promise<number>((resolve) => {
        finish = resolve;
      });
    };
    const waiting = Promise.all([
      cache.load('pool', loader),
      cache.load('pool', loader),
      cache.load('pool', loader),
    ]);
    finish(7);
    expect(await waiting).toEqual([7, 7, 7]);
    expect(await cache.load('pool', loader)).toBe(7);
    expect(loads).toBe(1);
  });

  it('stores nothing from a failed load: the next caller loads again', async () => {
    const cache = new TtlCache<number>(60_000);
    await expect(cache.load('pool', () => Promise.reject(new Error('database away')))).rejects.toThrow(
      'database away',
    );
    expect(cache.get('pool')).toBeUndefined();
    expect(await cache.load('pool', () => Promise.resolve(3))).toBe(3);
  });

  it('after clear(), a load begun before it is not shared and not stored', async () => {
    const cache = new TtlCache<string>(60_000);
    let finishOld: (value: string) => void = () => {};
    const old = cache.load('tenants', () => new Promise<string>((resolve) => (finishOld = resolve)));
    cache.clear();
    const fresh = cache.load('tenants', () => Promise.resolve('after'));
    finishOld('before');
    expect(await old).toBe('before');
    expect(await fresh).toBe('after');
    expect(await cache.load('tenants', () => Promise.resolve('again'))).toBe('after');
  });

  describe("late in an entry's life", () => {
    // The background reload's callbacks run (vi.waitFor would move the faked clock on).
    const settled = () => new Promise((resolve) => setImmediate(resolve));
    afterEach(() => {
      vi.useRealTimers();
    });

    it('answers the entry at once and reloads it in the background, so no caller waits for the reload', async () => {
      vi.useFakeTimers({ toFake: ['Date'] });
      const cache = new TtlCache<number>(4_000);
      expect(await cache.load('pool', () => Promise.resolve(1))).toBe(1);
      // Before the last quarter: the entry, and no load.
      vi.advanceTimersByTime(2_999);
      let loads = 0;
      let finish: (value: number) => void = () => {};
      const slow = () => {
        loads++;
        return new Promise<number>((resolve) => {
          finish = resolve;
        });
      };
      expect(await cache.load('pool', slow)).toBe(1);
      expect(loads).toBe(0);
      // In it: still the entry at once (the load has not answered), and one load for all callers.
      vi.advanceTimersByTime(1);
      expect(await cache.load('pool', slow)).toBe(1);
      expect(await cache.load('pool', slow)).toBe(1);
      expect(loads).toBe(1);
      finish(2);
      await settled();
      expect(cache.get('pool')).toBe(2);
      // The reloaded entry lives its own full life from the reload.
      vi.advanceTimersByTime(2_999);
      expect(await cache.load('pool', slow)).toBe(2);
      expect(loads).toBe(1);
    });

    it('past its life, callers wait for the running reload; a failed background reload leaves the entry to expire', async () => {
      vi.useFakeTimers({ toFake: ['Date'] });
      const cache = new TtlCache<number>(4_000);
      await cache.load('pool', () => Promise.resolve(1));
      vi.advanceTimersByTime(3_500);
      let finish: (value: number) => void = () => {};
      expect(await cache.load('pool', () => new Promise<number>((resolve) => (finish = resolve)))).toBe(1);
      vi.advanceTimersByTime(600);
      const waiting = cache.load('pool', () => Promise.resolve(99));
      finish(3);
      expect(await waiting).toBe(3);

      vi.advanceTimersByTime(3_500);
      expect(await cache.load('pool', () => Promise.reject(new Error('database away')))).toBe(3);
      await settled();
      expect(cache.get('pool')).toBe(3);
      vi.advanceTimersByTime(600);
      expect(cache.get('pool')).toBeUndefined();
      expect(await cache.load('pool', () => Promise.resolve(4))).toBe(4);
    });
  });
});
