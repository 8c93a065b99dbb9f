/**
 * A pool's policy: the one place each of its knobs is declared, with its bounds and its default.
 * `admin.createPool` and `admin.setPoolPolicy` validate against `poolPolicySchema` (strict: an
 * unknown knob is INVALID_INPUT); the readers go through `readPoolPolicy`, which never throws on a
 * stored document (a knob written before its bounds changed is read as absent, so its default
 * applies). A new knob is one entry here, with its default in `poolPolicyDefaults` when it has one.
 */
import { z } from 'zod';
import { disruptionPolicySchema } from './rollout-policy.ts';

const positiveMs = (max: number) => z.number().int().min(1).max(max);

/**
 * `policy.timers`: the lifecycle's moments for this pool, in milliseconds (see LifecycleTimers).
 * The billing window is not a pool's to change: meters are per hour.
 */
export const poolTimersSchema = z.strictObject({
  bindTimeoutMs: positiveMs(86_400_000).optional(),
  pendingRetryMs: positiveMs(3_600_000).optional(),
  maxPendingMs: positiveMs(30 * 86_400_000).optional(),
  preStartMs: positiveMs(86_400_000).optional(),
  recheckMs: positiveMs(86_400_000).optional(),
  maxBindFailures: z.number().int().min(1).max(20).optional(),
});

/** Every knob of a pool's policy. */
export const poolPolicyShape = {
  /** The per-GPU share of host CPU and memory a request without `resources` books. */
  perGpu: z
    .strictObject({
      vcpu: z.number().min(0).max(4096).optional(),
      memoryGiB: z.number().min(0).max(65_536).optional(),
    })
    .optional(),
  /** `budgetCheck: 'meter'`: every create checks the tenant's budget first. */
  admission: z.strictObject({ budgetCheck: z.enum(['off', 'meter']).optional() }).optional(),
  /** The pool serves `binding: 'kubernetes'` for its owner. */
  kubernetes: z.boolean().optional(),
  /** The pool serves `binding: 'node'` (whole machines, root on them). */
  tenantRoot: z.boolean().optional(),
  /** How long a reservation may stay pending before it fails (default 24 h). */
  maxPendingSeconds: z
    .number()
    .int()
    .min(60)
    .max(30 * 86_400)
    .optional(),
  /**
   * Time-slice or MPS replicas per GPU (default 4 for time-slice, 10 for MPS), and an MPS slot's
   * active thread percentage (default 100 ÷ replicas). domain/sharing.ts reads them.
   */
  sharing: z
    .strictObject({
      replicas: z.number().int().min(1).max(64).optional(),
      mpsThreadPercentage: z.number().int().min(1).max(100).optional(),
    })
    .optional(),
  /** CPUs kept for the host on every node (default 2): never in a cpuset, not allocatable. */
  hostReserve: z.strictObject({ vcpu: z.number().int().min(0).max(4096).optional() }).optional(),
  /** The lifecycle's timers for this pool (milliseconds). */
  timers: poolTimersSchema.optional(),
  /** Spot reservations: how long a preempted one keeps running after its notice (default 120 s). */
  spot: z.strictObject({ noticeSeconds: z.number().int().min(0).max(86_400).optional() }).optional(),
  /** Calendar reservations: how far ahead a `start` may be (default 90 days). */
  calendar: z.strictObject({ horizonDays: z.number().int().min(1).max(3_650).optional() }).optional(),
  /** bcd rollouts: at most this many nodes updating at once, reservations, soak (domain/rollout-policy.ts). */
  disruption: disruptionPolicySchema.optional(),
  /**
   * Who places the pool's requests: `inline` (default) during `create`, or `pool-lease`: `create`
   * queues them (`Queued`/`PoolPlacer`) and the worker holding the lease `pool:<id>` places them
   * in batches.
   */
  placer: z.enum(['inline', 'pool-lease']).optional(),
  /** The pool-lease placer: at most `batchSize` requests per batch transaction (default 64). */
  poolLease: z.strictObject({ batchSize: z.number().int().min(1).max(500).optional() }).optional(),
};

export const poolPolicySchema = z.strictObject(poolPolicyShape);

export type PoolPolicy = z.infer<typeof poolPolicySchema>;

/** The defaults of the knobs that have one beyond the lifecycle's timers. */
export const poolPolicyDefaults = {
  spotNoticeSeconds: 120,
  calendarHorizonDays: 90,
  poolLeaseBatchSize: 64,
} as const;

/** Policies read from a stored object, by that object (a cached pool's is read on every create). */
const readPolicies = new WeakMap<object, PoolPolicy>();

/**
 * A stored policy document as the readers see it: every knob that is valid by today's schema,
 * the others (and keys no longer declared) left out. Never throws; a non-object reads as `{}`.
 * A stored object is read once (the answer is shared: do not change it, nor the stored object).
 */
export function readPoolPolicy(stored: unknown): PoolPolicy {
  const raw = typeof stored === 'string' ? safeJson(stored) : stored;
  if (!raw || typeof raw !== 'object' || Array.isArray(raw)) return {};
  const known = readPolicies.get(raw);
  if (known) return known;
  const policy = parsePoolPolicy(raw as Record<string, unknown>);
  readPolicies.set(raw, policy);
  return policy;
}

function parsePoolPolicy(raw: Record<string, unknown>): PoolPolicy {
  const policy: Record<string, unknown> = {};
  for (const [key, schema] of Object.entries(poolPolicyShape)) {
    const value = raw[key];
    if (value === undefined) continue;
    const parsed = schema.safeParse(value);
    if (parsed.success) policy[key] = parsed.data;
  }
  return policy as PoolPolicy;
}

/** The notice a preempted spot reservation of this pool gets, in seconds. */
export function spotNoticeSeconds(policy: PoolPolicy): number {
  return policy.spot?.noticeSeconds ?? poolPolicyDefaults.spotNoticeSeconds;
}

/** How many days ahead a calendar reservation of this pool may start. */
export function calendarHorizonDays(policy: PoolPolicy): number {
  return policy.calendar?.horizonDays ?? poolPolicyDefaults.calendarHorizonDays;
}

/** Who places this pool's requests (`inline` unless the policy says `pool-lease`). */
export function poolPlacer(policy: PoolPolicy): 'inline' | 'pool-lease' {
  return policy.placer ?? 'inline';
}

/** How many queued requests one pool-lease batch places at most. */
export function poolLeaseBatchSize(policy: PoolPolicy): number {
  return policy.poolLease?.batchSize ?? poolPolicyDefaults.poolLeaseBatchSize;
}

function safeJson(text: string): unknown {
  try {
    return JSON.parse(text);
  } catch {
    return null;
  }
}
