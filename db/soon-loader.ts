import DataLoader from 'dataloader';
import type { Db } from '../core/database.ts';

/**
 * Gathers the calls made on one database handle before the event loop's next turn into one batch
 * (`batch`, answering one value or Error per key, in order): for statements that concurrent
 * requests can share. Nothing is cached; every call is answered afresh. Answers the function that
 * gives each handle its loader.
 */
export function loaderPerDb<K, V>(
  batch: (db: Db, keys: readonly K[]) => Promise<ArrayLike<V | Error>>,
  options: { maxBatchSize?: number } = {},
): (db: Db) => DataLoader<K, V> {
  const loaders = new WeakMap<Db, DataLoader<K, V>>();
  return (db) => {
    let loader = loaders.get(db);
    if (!loader) {
      loader = new DataLoader((keys: readonly K[]) => batch(db, keys), {
        cache: false,
        batchScheduleFn: (flush) => setImmediate(flush),
        ...(options.maxBatchSize ? { maxBatchSize: options.maxBatchSize } : {}),
      });
      loaders.set(db, loader);
    }
    return loader;
  };
}

/**
 * `together` for several keys, and when it fails (or for one key), `alone` for each: one key a
 * shared statement cannot take fails by itself, not the keys gathered with it.
 */
export async function togetherOrEachAlone<K, V>(
  keys: readonly K[],
  together: (keys: readonly K[]) => Promise<V[]>,
  alone: (key: K) => Promise<V>,
): Promise<Array<V | Error>> {
  if (keys.length > 1) {
    try {
      return await together(keys);
    } catch {
      // Each again by itself: the guard or the value that refused them all answers its own key.
    }
  }
  return Promise.all(
    keys.map((key) =>
      alone(key).catch((error: unknown) => (error instanceof Error ? error : new Error(String(error)))),
    ),
  );
}
