/** A message or call budget: `perSecond` on average, bursts up to `burst`. */
export class TokenBucket {
  private tokens: number;
  private last = Date.now(); // wall time: a rate, never stored

  constructor(
    private readonly perSecond: number,
    private readonly burst: number,
  ) {
    this.tokens = burst;
  }

  /** Takes one token if there is one. */
  take(): boolean {
    this.refill();
    if (this.tokens < 1) return false;
    this.tokens -= 1;
    return true;
  }

  /** How long until the next token (0 when one is there). */
  waitMs(): number {
    this.refill();
    if (this.tokens >= 1 || this.perSecond <= 0) return 0;
    return Math.ceil(((1 - this.tokens) / this.perSecond) * 1000);
  }

  /** Whether the bucket is full again (an idle key can be forgotten). */
  full(): boolean {
    this.refill();
    return this.tokens >= this.burst;
  }

  private refill(): void {
    const now = Date.now(); // wall time: a rate, never stored
    this.tokens = Math.min(this.burst, this.tokens + ((now - this.last) / 1000) * this.perSecond);
    this.last = now;
  }
}

/**
 * One token bucket per key (a peer address), at most `maxKeys` of them: when full, idle keys
 * (buckets refilled to their burst) are forgotten first, and if none is idle the oldest go, so
 * memory stays bounded whatever the number of peers.
 */
export class KeyedTokenBuckets {
  private readonly buckets = new Map<string, TokenBucket>();

  constructor(
    private readonly perSecond: number,
    private readonly burst: number,
    private readonly maxKeys = 10_000,
  ) {}

  /** Takes one token of `key`'s bucket; answers 0 when taken, else the wait in ms. */
  take(key: string): number {
    let bucket = this.buckets.get(key);
    if (!bucket) {
      if (this.buckets.size >= this.maxKeys) this.evict();
      bucket = new TokenBucket(this.perSecond, this.burst);
      this.buckets.set(key, bucket);
    }
    return bucket.take() ? 0 : Math.max(1, bucket.waitMs());
  }

  get size(): number {
    return this.buckets.size;
  }

  private evict(): void {
    for (const [key, bucket] of this.buckets) if (bucket.full()) this.buckets.delete(key);
    // Maps iterate in insertion order: the oldest keys go first.
    for (const key of this.buckets.keys()) {
      if (this.buckets.size < this.maxKeys) break;
      this.buckets.delete(key);
    }
  }
}
