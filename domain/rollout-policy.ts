import { z } from 'zod';

/**
 * A pool's disruption budget (`policy.disruption`): at most `maxUnavailable` of its nodes (a count,
 * or a percentage such as "10%", at least one node) restart bcd at once; whether nodes with active
 * reservations may restart it (bindings survive a bcd restart: the CDI spec and env file stay);
 * how long an updated node must stay healthy (the soak) and how long it may take to come back.
 */
export const disruptionPolicySchema = z.strictObject({
  maxUnavailable: z
    .union([
      z.number().int().min(1).max(100_000),
      z.string().regex(/^([1-9]\d?|100)%$/, 'a percentage from 1% to 100%, or a number of nodes'),
    ])
    .optional(),
  allowActiveReservations: z.boolean().optional(),
  soakSeconds: z.number().min(0.1).max(86_400).optional(),
  gateTimeoutSeconds: z.number().min(1).max(86_400).optional(),
});

export type DisruptionPolicy = z.infer<typeof disruptionPolicySchema>;

export interface EffectiveDisruption {
  maxUpdating: number;
  allowActiveReservations: boolean;
  soakMs: number;
  gateTimeoutMs: number;
}

export const defaultDisruption = {
  maxUnavailable: '10%',
  allowActiveReservations: true,
  soakSeconds: 120,
  /** Beyond the soak: time to stage, restart and reconnect. */
  gateTimeoutSeconds: 300,
} as const;

/**
 * The budget a pool of `poolNodes` nodes gives under its stored `policy` (unknown or bad fields
 * fall back to the defaults: 10%, active reservations allowed, 2 minutes of soak, 5 minutes to
 * come back): always at least one node.
 */
export function effectiveDisruption(policy: Record<string, unknown>, poolNodes: number): EffectiveDisruption {
  const parsed = disruptionPolicySchema.safeParse(policy.disruption ?? {});
  const d = parsed.success ? parsed.data : {};
  const max = d.maxUnavailable ?? defaultDisruption.maxUnavailable;
  const maxUpdating =
    typeof max === 'number' ? max : Math.floor((Number(max.slice(0, -1)) / 100) * poolNodes);
  const soakMs = (d.soakSeconds ?? defaultDisruption.soakSeconds) * 1000;
  return {
    maxUpdating: Math.max(1, maxUpdating),
    allowActiveReservations: d.allowActiveReservations ?? defaultDisruption.allowActiveReservations,
    soakMs,
    gateTimeoutMs: soakMs + (d.gateTimeoutSeconds ?? defaultDisruption.gateTimeoutSeconds) * 1000,
  };
}

/** The default waves: cumulative percentages of the selected nodes. */
export const defaultWaves = [1, 10, 50, 100] as const;

/**
 * Node counts per wave for `nodes` nodes and cumulative `percents` (the last must be 100): each
 * wave takes up to ceil(p% of nodes) in all, and empty waves are dropped.
 */
export function planWaveSizes(nodes: number, percents: readonly number[]): number[] {
  const sizes: number[] = [];
  let taken = 0;
  for (const p of percents) {
    const upTo = Math.min(nodes, Math.ceil((p / 100) * nodes));
    if (upTo > taken) {
      sizes.push(upTo - taken);
      taken = upTo;
    }
  }
  return sizes;
}

/** Failures in one wave that pause a rollout: 1 node or 5% of the wave, whichever is larger. */
export function failureThreshold(waveSize: number): number {
  return Math.max(1, Math.ceil(0.05 * waveSize));
}
