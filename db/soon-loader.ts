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
