/**
 * What a hold's booked host resources become on the node: the limits of its NodeSpec assignment
 * (`cpuMillis`, `memoryBytes`, `hugepages1Gi`) and, where the NUMA nodes of its devices can carry
 * it, a cpuset (`cpus`, `mems`) that never includes the host's reserved CPUs. Pure.
 */

/** Bounds on a cpulist read from a node's inventory, so an oversized one cannot stall anything. */
export const cpulistBounds = { maxCpuId: 8191, maxChars: 32 * 1024, maxParts: 4096 } as const;

/** The default `policy.hostReserve.vcpu`: CPUs kept for the host itself, never in a cpuset. */
export const defaultHostReserveVcpu = 2;

/**
 * Parses a kernel cpulist (`0-3,8,10-11`) into sorted CPU ids. A list past the bounds (a CPU id
 * above 8191, more than 32 KiB or 4096 parts) or malformed reads as empty.
 */
export function parseCpulist(list: string): number[] {
  const text = list.trim();
  if (text === '' || text.length > cpulistBounds.maxChars) return [];
  const parts = text.split(',');
  if (parts.length > cpulistBounds.maxParts) return [];
  const out = new Set<number>();
  for (const part of parts) {
    const match = /^(\d{1,5})(?:-(\d{1,5}))?$/.exec(part.trim());
    if (!match) return [];
    const from = Number(match[1]);
    const to = match[2] === undefined ? from : Number(match[2]);
    if (to < from || to > cpulistBounds.maxCpuId) return [];
    for (let cpu = from; cpu <= to; cpu++) out.add(cpu);
  }
  return [...out].sort((a, b) => a - b);
}

/** Formats CPU ids as a compact cpulist (`0-3,8`). */
export function formatCpulist(cpus: readonly number[]): string {
  const sorted = [...new Set(cpus)].sort((a, b) => a - b);
  const out: string[] = [];
  for (let i = 0; i < sorted.length; ) {
    let j = i;
    while (j + 1 < sorted.length && sorted[j + 1] === sorted[j]! + 1) j++;
    out.push(i === j ? `${sorted[i]}` : `${sorted[i]}-${sorted[j]}`);
    i = j + 1;
  }
  return out.join(',');
}

/** The host's reserved CPUs: the lowest `reserve` CPUs that are not isolated. */
export function reservedCpus(
  allCpus: readonly number[],
  isolated: readonly number[],
  reserve: number,
): number[] {
  const iso = new Set(isolated);
  return [...allCpus]
    .sort((a, b) => a - b)
    .filter((c) => !iso.has(c))
    .slice(0, Math.max(0, reserve));
}

export interface NumaNodeFacts {
  node: number;
  /** The node's cpulist. */
  cpus: string;
  memoryGiB: number;
}

export interface AssignmentLimits {
  cpuMillis?: number;
  memoryBytes?: number;
  hugepages1Gi?: number;
  /** The cpuset's CPUs, when the devices' NUMA nodes have enough of them. */
  cpus?: string;
  /** The cpuset's memory nodes, when those NUMA nodes have enough memory. */
  mems?: string;
}

/**
 * The limits of one hold. `cpus` is the CPUs of the devices' NUMA nodes without the host's reserved
 * ones (the lowest non-isolated `reserveVcpu`), set only when at least `vcpu` of them remain; `mems`
 * those NUMA nodes, set only when they have at least `memoryGiB` together. Nothing booked: no limits.
 */
export function assignmentLimits(input: {
  booked: { vcpu: number; memoryGiB: number; hugepages1Gi: number };
  /** NUMA nodes of the hold's devices (-1: unknown, ignored). */
  deviceNumaNodes: readonly number[];
  numa: readonly NumaNodeFacts[];
  isolatedCpus?: string;
  reserveVcpu?: number;
}): AssignmentLimits | undefined {
  const { vcpu, memoryGiB, hugepages1Gi } = input.booked;
  if (vcpu <= 0 && memoryGiB <= 0 && hugepages1Gi <= 0) return undefined;
  const limits: AssignmentLimits = {};
  if (vcpu > 0) limits.cpuMillis = Math.round(vcpu * 1000);
  if (memoryGiB > 0) limits.memoryBytes = Math.round(memoryGiB * 1024 ** 3);
  if (hugepages1Gi > 0) limits.hugepages1Gi = Math.round(hugepages1Gi);
  const wanted = new Set(input.deviceNumaNodes.filter((n) => n >= 0));
  const nodes = input.numa.filter((n) => wanted.has(n.node));
  if (nodes.length === 0) return limits;
  const allCpus = input.numa.flatMap((n) => parseCpulist(n.cpus));
  const reserved = new Set(
    reservedCpus(
      allCpus,
      parseCpulist(input.isolatedCpus ?? ''),
      input.reserveVcpu ?? defaultHostReserveVcpu,
    ),
  );
  const usable = nodes.flatMap((n) => parseCpulist(n.cpus)).filter((c) => !reserved.has(c));
  if (vcpu > 0 && usable.length >= vcpu) limits.cpus = formatCpulist(usable);
  const memory = nodes.reduce((sum, n) => sum + n.memoryGiB, 0);
  if (memoryGiB > 0 && memory >= memoryGiB) limits.mems = formatCpulist(nodes.map((n) => n.node));
  return limits;
}

/** `policy.hostReserve.vcpu` of a pool, or the default 2. */
export function hostReserveVcpu(policy: Record<string, unknown>): number {
  const raw = (policy.hostReserve as { vcpu?: unknown } | undefined)?.vcpu;
  return typeof raw === 'number' && Number.isInteger(raw) && raw >= 0 && raw <= 4096
    ? raw
    : defaultHostReserveVcpu;
}
