import { describe, expect, it } from 'vitest';
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
});
