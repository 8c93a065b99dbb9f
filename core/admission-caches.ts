import type { HostResourceAmounts } from '../domain/reservation-request.ts';
import { PlacerNodeCache } from './placer-node-cache.ts';

/** A pool a tenant may book, as admission reads it (owned by or offered to the tenant). */
export interface PoolForTenant {
  id: string;
  owner_tenant_id: string;
  gpu_model: string;
  sharing_mode: string;
  policy: Record<string, unknown>;
  region: string;
  on_budget_exceeded: string | null;
}

/** The share of an entry's life after which a caller's read of it also begins its reload. */
const refreshAheadShare = 0.75;

/**
 * A small map of entries that expire `ttlMs` after they were stored; cleared whole when it grows
 * past `maxEntries` (keys are pools and tenants, so that only happens on unusual fleets).
 */
export class TtlCache<V> {
  readonly #entries = new Map<string, { at: number; value: V }>();
  readonly #loading = new Map<string, Promise<V>>();
  /** Bumped by clear(): a load begun before it is neither shared after it nor stored. */
  #generation = 0;
  readonly ttlMs: number;
  readonly maxEntries: number;

  constructor(ttlMs: number, maxEntries = 10_000) {
    this.ttlMs = ttlMs;
    this.maxEntries = maxEntries;
  }

  /** The value stored less than `ttlMs` (this cache's by default) ago, else undefined. */
  get(key: string, ttlMs = this.ttlMs): V | undefined {
    const hit = this.#entries.get(key);
    // wall time: a TTL of a heuristic cache, which decides no booking
    return hit && Date.now() - hit.at < ttlMs ? hit.value : undefined;
  }

  set(key: string, value: V): void {
    if (this.#entries.size > this.maxEntries) this.#entries.clear();
    // wall time: when the entry was stored, for its TTL
    this.#entries.set(key, { at: Date.now(), value });
  }

  /**
   * The value stored less than `ttlMs` ago, else `loader`'s, stored; callers that ask while a load
   * runs share it (one read when an entry expires under many concurrent callers, not one each).
   * A failed load is every waiting caller's error and stores nothing; a load begun before a
   * clear() answers its own callers only. An entry asked for in the last quarter of its life is
   * loaded again in the background while it still answers, so that under steady use callers never
   * wait for its reload (a background load that fails leaves the entry to expire as it would have).
   */
  load(key: string, loader: () => Promise<V>): Promise<V> {
    const hit = this.#entries.get(key);
    // wall time: a TTL of a heuristic cache, which decides no booking
    const age = hit ? Date.now() - hit.at : Number.POSITIVE_INFINITY;
    if (hit && age < this.ttlMs) {
      if (age >= this.ttlMs * refreshAheadShare && !this.#loading.has(key)) {
        this.#begin(key, loader).catch(() => undefined);
      }
      return Promise.resolve(hit.value);
    }
    return this.#loading.get(key) ?? this.#begin(key, loader);
  }

  /** Runs `loader` as the shared load of `key`, storing its value unless clear() came meanwhile. */
  #begin(key: string, loader: () => Promise<V>): Promise<V> {
    const generation = this.#generation;
    const loading: Promise<V> = loader()
      .then((value) => {
        if (generation === this.#generation) this.set(key, value);
        return value;
      })
      .finally(() => {
        if (this.#loading.get(key) === loading) this.#loading.delete(key);
      });
    this.#loading.set(key, loading);
    return loading;
  }

  clear(): void {
    this.#generation++;
    this.#loading.clear();
    this.#entries.clear();
  }
}

/**
 * Admission's short-lived caches of heuristic inputs, created once per process and passed in the
 * `Deps` bag (no module state). None of them decides a booking: every candidate node is re-read,
 * the booking is decided under locks and the EXCLUDE constraint, and the draft's insert re-checks
 * the pool's offer in the same statement.
 */
export interface AdmissionCaches {
  /** Schedulable node ids per pool (5 s): the population placement samples are drawn from. */
  schedulable: TtlCache<string[]>;
  /** The measured per-GPU host share per pool (30 s). */
  share: TtlCache<HostResourceAmounts>;
  /** Positive poolForTenant answers per tenant and pool (5 s). */
  pools: TtlCache<PoolForTenant>;
  /** Nodes of large pools as the placer last read them (10 s), each re-checked when booked. */
  placerNodes: PlacerNodeCache;
}

export function createAdmissionCaches(): AdmissionCaches {
  return {
    schedulable: new TtlCache<string[]>(5_000),
    share: new TtlCache<HostResourceAmounts>(30_000),
    pools: new TtlCache<PoolForTenant>(5_000),
    placerNodes: new PlacerNodeCache(),
  };
}
