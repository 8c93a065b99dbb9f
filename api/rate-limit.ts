import type { Config } from '../core/config.ts';
import type { Principal } from '../core/iam-port.ts';
import { ComputeError } from '../domain/errors.ts';

/** A rate: `perSecond` calls refilled continuously, at most `burst` at once; `perSecond: 0` is no limit. */
export interface Rate {
  perSecond: number;
  burst: number;
}

function assertRate(rate: Rate, name: string) {
  if (!(Number.isFinite(rate.perSecond) && rate.perSecond >= 0)) {
    throw new Error(`rate limit ${name}: perSecond must be a finite number >= 0, got ${rate.perSecond}`);
  }
  if (!(Number.isInteger(rate.burst) && rate.burst >= 1)) {
    throw new Error(`rate limit ${name}: burst must be a whole number >= 1, got ${rate.burst}`);
  }
}

/**
 * In-process token buckets, one per key. A bucket idle long enough to be full again is the same
 * as no bucket, so those are dropped first when the map reaches `maxKeys`.
 */
export class TokenBuckets {
  private readonly buckets = new Map<string, { tokens: number; at: number }>();

  constructor(
    private readonly rate: Rate,
    private readonly maxKeys = 100_000,
  ) {}

  /** Seconds until `key` may make one call (0: now), without taking anything. */
  waitSeconds(key: string, nowMs: number): number {
    if (this.rate.perSecond === 0) return 0;
    const tokens = this.tokensAt(key, nowMs);
    return tokens >= 1 ? 0 : (1 - tokens) / this.rate.perSecond;
  }

  /** Takes one call from `key`'s bucket (callers check `waitSeconds` first). */
  take(key: string, nowMs: number): void {
    if (this.rate.perSecond === 0) return;
    const tokens = this.tokensAt(key, nowMs);
    this.buckets.delete(key); // re-inserted last: the map stays in order of last use
    if (this.buckets.size >= this.maxKeys) this.evict(nowMs);
    this.buckets.set(key, { tokens: tokens - 1, at: nowMs });
  }

  private tokensAt(key: string, nowMs: number): number {
    const bucket = this.buckets.get(key);
    if (!bucket) return this.rate.burst;
    const refilled = (Math.max(0, nowMs - bucket.at) / 1000) * this.rate.perSecond;
    return Math.min(this.rate.burst, bucket.tokens + refilled);
  }

  private evict(nowMs: number) {
    for (const [key, bucket] of this.buckets) {
      if (this.buckets.size < this.maxKeys) return;
      const full = bucket.tokens + ((nowMs - bucket.at) / 1000) * this.rate.perSecond >= this.rate.burst;
      // Least recently used first; stop at the first one still filling and drop by age below.
      if (!full) break;
      this.buckets.delete(key);
    }
    while (this.buckets.size >= this.maxKeys) this.buckets.delete(this.buckets.keys().next().value!);
  }
}

export interface RateLimits {
  perToken: Rate;
  perTenant: Rate;
}

/** The limits of `BETTER_COMPUTE_RATE_LIMIT_PER_TOKEN[_BURST]` and `…_PER_TENANT[_BURST]`. */
export function rateLimitsFromConfig(config: Config): RateLimits {
  return {
    perToken: {
      perSecond: config.BETTER_COMPUTE_RATE_LIMIT_PER_TOKEN,
      burst: config.BETTER_COMPUTE_RATE_LIMIT_PER_TOKEN_BURST,
    },
    perTenant: {
      perSecond: config.BETTER_COMPUTE_RATE_LIMIT_PER_TENANT,
      burst: config.BETTER_COMPUTE_RATE_LIMIT_PER_TENANT_BURST,
    },
  };
}

/**
 * Per-token and per-tenant rate limits for API calls, in this process (each API process limits on
 * its own). A call takes one from both buckets or from neither: RATE_LIMITED (HTTP 429) with
 * `details.retryAfterSeconds`, the whole seconds after which the same call would pass.
 */
export function createRateLimiter(limits: RateLimits) {
  assertRate(limits.perToken, 'per token');
  assertRate(limits.perTenant, 'per tenant');
  const byToken = new TokenBuckets(limits.perToken);
  const byTenant = new TokenBuckets(limits.perTenant);
  return function admit(principal: Principal): void {
    // wall time: buckets refill with elapsed real time, not with the database clock.
    const now = performance.now();
    const tokenKey = principal.tokenId ?? `identity:${principal.identityId}`;
    const tokenWait = byToken.waitSeconds(tokenKey, now);
    const tenantWait = byTenant.waitSeconds(principal.tenantId, now);
    if (tokenWait > 0 || tenantWait > 0) {
      const scope = tokenWait >= tenantWait ? 'token' : 'tenant';
      const rate = scope === 'token' ? limits.perToken : limits.perTenant;
      const retryAfterSeconds = Math.max(1, Math.ceil(Math.max(tokenWait, tenantWait)));
      throw new ComputeError(
        'RATE_LIMITED',
        `too many calls for this ${scope} (at most ${rate.perSecond} per second, ${rate.burst} at once): retry after ${retryAfterSeconds} s`,
        { retryAfterSeconds, scope, perSecond: rate.perSecond, burst: rate.burst },
      );
    }
    byToken.take(tokenKey, now);
    byTenant.take(principal.tenantId, now);
  };
}

export type RateLimiter = ReturnType<typeof createRateLimiter>;
