import type { IamPort, Principal } from '../core/iam-port.ts';
import { ComputeError } from '../domain/errors.ts';
import { createTokenAnswerCache } from './authenticate-token-cache.ts';

/**
 * Authenticates bearer tokens through IAM with a 30-second cache (keyed by the token's hash, never
 * the token), so a burst of calls costs one lookup. A revoked token stops working within 30 s.
 */
export function createAuthenticator(iam: IamPort, options: { ttlMs?: number; maxEntries?: number } = {}) {
  const cache = createTokenAnswerCache<Principal>({
    ttlMs: options.ttlMs ?? 30_000,
    maxEntries: options.maxEntries ?? 10_000,
  });
  return async function authenticate(token: string | undefined): Promise<Principal> {
    if (!token) {
      throw new ComputeError(
        'UNAUTHENTICATED',
        'no credential: send an API token as `Authorization: Bearer <token>` (the CLI reads --token or BETTER_COMPUTE_TOKEN)',
      );
    }
    const key = cache.keyOf(token);
    // Whether a token is expired or revoked is IAM's answer, by compute_now(); a cached answer
    // lapses within `ttlMs`, as a revocation does.
    const now = Date.now(); // wall time: this cache's TTL
    const hit = cache.get(key, now);
    if (hit) return hit;
    const principal = await iam.authenticate({ token });
    cache.set(key, principal, now);
    return principal;
  };
}

export type Authenticator = ReturnType<typeof createAuthenticator>;

/** The bearer token of an Authorization header, if any. */
export function bearerToken(header: string | null | undefined): string | undefined {
  const match = /^Bearer\s+(\S+)$/i.exec(header ?? '');
  return match?.[1];
}
