import { afterAll, beforeAll } from 'vitest';

/**
 * Starts a fixture before the tests of the enclosing file (or `describe` block) and stops it after
 * them. The answer stands for the started fixture: read it in hooks and tests, never at load time.
 * A fixture that failed to start is not stopped.
 */
export function useFixture<T extends object>(
  start: () => Promise<T>,
  stop: (fixture: T) => Promise<void>,
): T {
  let fixture: T | undefined;
  beforeAll(async () => {
    fixture = await start();
  });
  afterAll(async () => {
    if (fixture) await stop(fixture);
  });
  const started = (): T => {
    if (!fixture) throw new Error('a fixture was read before its beforeAll hook started it');
    return fixture;
  };
  return new Proxy({} as T, {
    get(_, key) {
      const target = started();
      const value = Reflect.get(target, key, target);
      return typeof value === 'function' ? value.bind(target) : value;
    },
    set: (_, key, value) => Reflect.set(started(), key, value),
    has: (_, key) => Reflect.has(started(), key),
    ownKeys: () => Reflect.ownKeys(started()),
    getOwnPropertyDescriptor: (_, key) => {
      const descriptor = Reflect.getOwnPropertyDescriptor(started(), key);
      return descriptor && { ...descriptor, configurable: true };
    },
  });
}
