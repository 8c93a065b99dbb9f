import type { Config } from '../core/config.ts';
import type { Principal } from '../core/iam-port.ts';
import { ComputeError } from '../domain/errors.ts';

export interface StreamLimits {
  perToken: number;
  perTenant: number;
}

/** `BETTER_COMPUTE_EVENT_STREAMS_PER_TOKEN` and `…_PER_TENANT`. */
export function streamLimitsFromConfig(config: Config): StreamLimits {
  return {
    perToken: config.BETTER_COMPUTE_EVENT_STREAMS_PER_TOKEN,
    perTenant: config.BETTER_COMPUTE_EVENT_STREAMS_PER_TENANT,
  };
}

/** How long a refused stream is told to wait: a slot frees when one of the caller's streams closes. */
const retryAfterSeconds = 5;

function assertLimit(value: number, name: string) {
  if (!(Number.isInteger(value) && value >= 1)) {
    throw new Error(`event stream limit ${name} must be a whole number >= 1, got ${value}`);
  }
}

/**
 * Counts the open event streams of this process per token and per tenant. `acquire` takes one slot
 * of both or neither: past either limit, RATE_LIMITED (HTTP 429) with `details.retryAfterSeconds`.
 */
export function createStreamSlots(limits: StreamLimits) {
  assertLimit(limits.perToken, 'per token');
  assertLimit(limits.perTenant, 'per tenant');
  const byToken = new Map<string, number>();
  const byTenant = new Map<string, number>();
  const take = (map: Map<string, number>, key: string, by: number) => {
    const next = (map.get(key) ?? 0) + by;
    if (next > 0) map.set(key, next);
    else map.delete(key);
  };
  return {
    /** Takes a slot for one stream of `principal`; answers its release (calling it twice is harmless). */
    acquire(principal: Principal): () => void {
      const tokenKey = principal.tokenId ?? `identity:${principal.identityId}`;
      const tenantKey = principal.tenantId;
      const scope =
        (byToken.get(tokenKey) ?? 0) >= limits.perToken
          ? 'token'
          : (byTenant.get(tenantKey) ?? 0) >= limits.perTenant
            ? 'tenant'
            : null;
      if (scope) {
        const limit = scope === 'token' ? limits.perToken : limits.perTenant;
        throw new ComputeError(
          'RATE_LIMITED',
          `too many open event streams for this ${scope} (at most ${limit} at once): close one, or follow several subjects with one stream (filter on the client), and retry after ${retryAfterSeconds} s`,
          { retryAfterSeconds, scope, limit },
        );
      }
      take(byToken, tokenKey, 1);
      take(byTenant, tenantKey, 1);
      let released = false;
      return () => {
        if (released) return;
        released = true;
        take(byToken, tokenKey, -1);
        take(byTenant, tenantKey, -1);
      };
    },
    /** Open streams of this process (for tests and metrics). */
    open: () => [...byTenant.values()].reduce((a, b) => a + b, 0),
  };
}

export type StreamSlots = ReturnType<typeof createStreamSlots>;
