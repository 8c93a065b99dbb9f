import type { PoolSharingMode } from './fleet.ts';

/**
 * The one place that says what a shared GPU's atom is worth. Each sharing mode's atom takes the
 * same fraction of a GPU's host share (the pool's per-GPU CPU and memory) as it is billed: a MIG
 * instance its compute slices out of the GPU's seven, a time-slice or MPS slot one of the pool's
 * `policy.sharing.replicas` (default 4 for time-slice, 10 for MPS). Admission's host share, usage
 * metering and the capacity views all read these functions.
 */

/** The compute slices of a full GPU: every MIG profile is `<slices>g.<memory>gb` out of these. */
export const migSlicesPerGpu = 7;

/** Slots per GPU when the pool's policy does not set `sharing.replicas`. */
export const defaultReplicas: Record<'time-slice' | 'mps', number> = { 'time-slice': 4, mps: 10 };

/** Default MPS active thread percentage of a slot: an equal share of the GPU's SMs. */
export function defaultMpsThreadPercentage(replicas: number): number {
  return Math.max(1, Math.floor(100 / Math.max(1, replicas)));
}

/** A MIG profile as nvidia-smi names it: `1g.10gb`, `3g.40gb`, `1g.10gb+me`, `7g.80gb`. */
export const migProfilePattern = /^([1-7])g\.(\d{1,4})gb(\+me)?$/;

/** The compute slices of a MIG profile (`3g.40gb` → 3), or null when it is not a profile name. */
export function migProfileSlices(profile: string): number | null {
  const match = migProfilePattern.exec(profile);
  return match ? Number(match[1]) : null;
}

/** The pool's slots per GPU: `policy.sharing.replicas` when it is a whole number 1..64, else the default. */
export function poolReplicas(mode: 'time-slice' | 'mps', policy: Record<string, unknown>): number {
  const raw = (policy.sharing as { replicas?: unknown } | undefined)?.replicas;
  return typeof raw === 'number' && Number.isInteger(raw) && raw >= 1 && raw <= 64
    ? raw
    : defaultReplicas[mode];
}

/** The atom class a pool of this sharing mode books. */
export function atomClassFor(mode: PoolSharingMode): 'gpu' | 'gpu.mig' | 'gpu.slot' {
  switch (mode) {
    case 'exclusive':
      return 'gpu';
    case 'mig':
      return 'gpu.mig';
    case 'time-slice':
    case 'mps':
      return 'gpu.slot';
  }
}

/**
 * What one atom of a pool is worth as a fraction of a GPU: `hostShare` scales the pool's per-GPU
 * host share at admission, `billingWeight` scales hours into GPU-hours on its meter. They are the
 * same number by design; both are named so that each reader says which one it means.
 */
export function atomWorth(input: {
  deviceClass: string;
  mode: PoolSharingMode;
  policy: Record<string, unknown>;
  /** The MIG profile when known (a booked atom, or a selector naming one). */
  profile?: string | undefined;
}): { hostShare: number; billingWeight: number } {
  let fraction: number;
  if (input.deviceClass === 'gpu.mig') {
    fraction = (migProfileSlices(input.profile ?? '') ?? 1) / migSlicesPerGpu;
  } else if (input.deviceClass === 'gpu.slot') {
    const mode = input.mode === 'mps' ? 'mps' : 'time-slice';
    fraction = 1 / poolReplicas(mode, input.policy);
  } else {
    fraction = 1;
  }
  return { hostShare: fraction, billingWeight: fraction };
}

/** Meter-name safe form of a model or profile: `NVIDIA H100 80GB HBM3` → `nvidia-h100-80gb-hbm3`. */
export function meterPart(value: string): string {
  return (
    value
      .toLowerCase()
      .replace(/[^a-z0-9.]+/g, '-')
      .replace(/^-+|-+$/g, '') || 'other'
  );
}

/**
 * The billing meter of one atom kind: `gpu.<model>.hours` for whole GPUs,
 * `gpu.<model>.mig.<profile>.hours` for MIG instances, `gpu.<model>.slot.hours` for time-slice and
 * MPS slots. Quantities on every meter are GPU-hours (hours × billingWeight).
 */
export function atomMeter(model: string, deviceClass: string, profile?: string): string {
  const m = meterPart(model);
  if (deviceClass === 'gpu.mig') return `gpu.${m}.mig.${meterPart(profile ?? 'unknown')}.hours`;
  if (deviceClass === 'gpu.slot') return `gpu.${m}.slot.hours`;
  return `gpu.${m}.hours`;
}
