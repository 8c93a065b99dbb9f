import { createHash } from 'node:crypto';

/**
 * The authenticators' memory of answers per bearer token: keyed by the token's SHA-256 hash (never
 * the token), each answer kept `ttlMs` after `now` (wall time: a TTL, read by the caller), and the
 * oldest entry gives way once `maxEntries` are held.
 */
export function createTokenAnswerCache<V>(options: { ttlMs: number; maxEntries: number }) {
  const entries = new Map<string, { value: V; expiresAt: number }>();
  return {
    /** The key a token is remembered under. */
    keyOf(token: string): string {
      return createHash('sha256').update(token).digest('base64url');
    },
    /** The answer remembered for `key` if it has not lapsed at `now`; a lapsed one is dropped. */
    get(key: string, now: number): V | undefined {
      const hit = entries.get(key);
      if (!hit) return undefined;
      if (hit.expiresAt > now) return hit.value;
      entries.delete(key);
      return undefined;
    },
    /** Remembers `value` for `key` until `now + ttlMs`. */
    set(key: string, value: V, now: number): void {
      if (entries.size >= options.maxEntries) entries.delete(entries.keys().next().value!);
      entries.set(key, { value, expiresAt: now + options.ttlMs });
    },
  };
}
