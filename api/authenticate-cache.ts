import { ComputeError } from '../domain/errors.ts';
import type { Authenticator } from './authenticate.ts';
import { createTokenAnswerCache } from './authenticate-token-cache.ts';

/**
 * Wraps an authenticator with a cache of refused tokens (keyed by the token's hash, never the
 * token): a token IAM answered UNAUTHENTICATED for is refused again for `ttlMs` without a lookup,
 * so a flood of one bad token costs one database read. Only UNAUTHENTICATED is remembered; any
 * other failure (the database down) is tried again on the next call. Tokens are random secrets
 * that never become valid later, so remembering a refusal changes no answer.
 */
export function withFailedLookupCache(
  authenticate: Authenticator,
  options: { ttlMs?: number; maxEntries?: number; now?: () => number } = {},
): Authenticator {
  const refused = createTokenAnswerCache<ComputeError>({
    ttlMs: options.ttlMs ?? 30_000,
    maxEntries: options.maxEntries ?? 10_000,
  });
  // wall time: a TTL cache.
  const clock = options.now ?? Date.now;
  return async function authenticateOrRefuseFromCache(token) {
    if (!token) return authenticate(token);
    const key = refused.keyOf(token);
    const now = clock();
    const hit = refused.get(key, now);
    if (hit) throw hit;
    try {
      return await authenticate(token);
    } catch (error) {
      if (error instanceof ComputeError && error.code === 'UNAUTHENTICATED') {
        refused.set(key, error, now);
      }
      throw error;
    }
  };
}
