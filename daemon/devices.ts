import { mkdirSync, readdirSync, renameSync, rmSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import type { GpuInventory } from '../domain/inventory-sections.ts';
import type { DeviceAssignment } from '../domain/node-spec.ts';
import { defaultMpsThreadPercentage } from '../domain/sharing.ts';
import { type CgroupDriver, sliceName } from './cgroups.ts';

/**
 * The devices converger: for each assignment of the NodeSpec's `devices` section, a CDI spec naming
 * exactly the booked GPUs (`bcd-<allocation>.json`, devices `bcd.dev/gpu=<uuid>`) and an env file
 * (`<allocation>.env`); holds no longer assigned are removed. It never drops a hold on its own.
 */
export interface DeviceRoots {
  cdiDir: string;
  envDir: string;
}

export interface HeldAllocation {
  allocationId: string;
  gpuUuids: string[];
  cdiDevices: string[];
  cdiSpecFile: string;
  envFile: string;
  /** `bcd-alloc-<allocation>.slice` when the assignment carries limits, else ''. */
  cgroupParent: string;
  /** `kubernetes`: the device plugin hands these atoms to the kubelet. */
  binding: DeviceAssignment['binding'];
}

const allocationPattern = /^[A-Za-z0-9_-]{1,100}$/;
const uuidPattern = /^[A-Za-z0-9-]{1,200}$/;
/** A time-slice or MPS slot's atom id: its GPU's UUID and the slot number. */
const slotPattern = /^(GPU-[A-Za-z0-9-]+)-slot-(\d{1,2})$/;

/** What the node has, for checking an assignment before it is bound. */
export interface HoldContext {
  /** The GPUs the driver sees now (with their MIG instances); undefined: not checked. */
  gpus?: readonly GpuInventory[];
  /** The host's memory for holds, bytes; undefined: not admitted against. */
  hostMemoryBytes?: number;
  /** Where slices are made; null or undefined: limits travel in the env file only. */
  cgroups?: CgroupDriver | null;
  /** MPS pipe directories live under this (default /run/bcd/mps). */
  mpsDir?: string;
}

/** Why a hold could not be honoured: bcd reports it as a node-signed AllocationFailed. */
export interface HoldFailure {
  allocationId: string;
  reason: 'device-unavailable' | 'resources-exhausted' | 'cgroup-failed';
  message: string;
}

/** The device a workload sees for one booked atom: a GPU, a MIG instance, or a slot's GPU. */
export function visibleDeviceOf(stableId: string): string {
  return slotPattern.exec(stableId)?.[1] ?? stableId;
}

/**
 * Null when every atom of the assignment is present and healthy on the node, else why not. With
 * `presentOnly` (a hold already bound) only a missing atom counts: an unhealthy one is still the
 * workload's, and the control plane shows it as `AtomUnhealthy` from the inventory.
 */
export function checkAtoms(
  assignment: DeviceAssignment,
  gpus: readonly GpuInventory[],
  options: { presentOnly?: boolean } = {},
): string | null {
  const byUuid = new Map(gpus.map((g) => [g.uuid, g]));
  const migs = new Map(gpus.flatMap((g) => (g.mig?.instances ?? []).map((m) => [m.uuid, g] as const)));
  const problems: string[] = [];
  for (const id of assignment.stableIds) {
    const gpu = id.startsWith('MIG-') ? migs.get(id) : byUuid.get(visibleDeviceOf(id));
    if (!gpu) problems.push(`${id} is missing`);
    else if (gpu.health !== 'healthy' && !options.presentOnly) problems.push(`${id} is ${gpu.health}`);
  }
  return problems.length > 0 ? problems.join(', ') : null;
}

function writeAtomic(file: string, content: string): void {
  const tmp = `${file}.tmp`;
  writeFileSync(tmp, content, { mode: 0o644 });
  renameSync(tmp, file);
}

export function cdiFileFor(roots: DeviceRoots, allocationId: string): string {
  return path.join(roots.cdiDir, `bcd-${allocationId}.json`);
}

export function envFileFor(roots: DeviceRoots, allocationId: string): string {
  return path.join(roots.envDir, `${allocationId}.env`);
}

/** Writes the hold of one assignment; refuses ids that are not plain names (no path tricks). */
export function writeHold(
  roots: DeviceRoots,
  assignment: DeviceAssignment,
  context: HoldContext = {},
): HeldAllocation {
  const { allocationId } = assignment;
  if (!allocationPattern.test(allocationId) || !assignment.stableIds.every((u) => uuidPattern.test(u))) {
    throw new Error(`refusing assignment with unsafe ids: ${allocationId.slice(0, 100)}`);
  }
  mkdirSync(roots.cdiDir, { recursive: true });
  mkdirSync(roots.envDir, { recursive: true });
  const uuids = [...assignment.stableIds];
  const visible = [...new Set(uuids.map(visibleDeviceOf))];
  const cdiSpecFile = cdiFileFor(roots, allocationId);
  const envFile = envFileFor(roots, allocationId);
  const limits = assignment.limits ?? {};
  const limited = Object.values(limits).some((v) => typeof v === 'number' && v > 0);
  // A kubernetes binding's pods live in the kubelet's cgroups: no slice of bcd's own.
  const sliced = limited && assignment.binding !== 'kubernetes';
  // The slice a workload manager places the workload in, made with the limits (the kernel enforces
  // them); the limits also travel in the env file.
  const cgroupParent = sliced ? sliceName(allocationId) : '';
  if (sliced && context.cgroups) context.cgroups.apply(cgroupParent, limits);
  const limitLines = sliced
    ? [
        `BCD_CGROUP_PARENT=${cgroupParent}`,
        ...(limits.cpuMillis ? [`BCD_CPU_MILLIS=${limits.cpuMillis}`] : []),
        ...(limits.memoryBytes ? [`BCD_MEMORY_BYTES=${limits.memoryBytes}`] : []),
        ...(limits.hugepages1Gi ? [`BCD_HUGEPAGES_1GI=${limits.hugepages1Gi}`] : []),
        ...(limits.cpus ? [`BCD_CPUSET_CPUS=${limits.cpus}`] : []),
        ...(limits.mems ? [`BCD_CPUSET_MEMS=${limits.mems}`] : []),
      ]
    : [];
  const sharing = assignment.sharing;
  const mpsPipe = (gpu: string) => path.join(context.mpsDir ?? '/run/bcd/mps', gpu);
  const sharingEnv = sharing
    ? [
        `BCD_SHARING_MODE=${sharing.mode}`,
        `BCD_SHARING_REPLICAS=${sharing.replicas}`,
        ...(sharing.mode === 'mps'
          ? [
              `CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=${sharing.mpsThreadPercentage ?? defaultMpsThreadPercentage(sharing.replicas)}`,
              `CUDA_MPS_PIPE_DIRECTORY=${mpsPipe(visible[0] ?? 'none')}`,
            ]
          : []),
      ]
    : [];
  const spec = {
    cdiVersion: '0.6.0',
    kind: 'bcd.dev/gpu',
    annotations: {
      'bcd.dev/allocation': allocationId,
      'bcd.dev/until': String(assignment.until),
      // Marks the spec for bcd's device plugin, which hands these devices to the kubelet.
      ...(assignment.binding === 'kubernetes' ? { 'bcd.dev/binding': 'kubernetes' } : {}),
      ...(sliced ? { 'bcd.dev/cgroup-parent': cgroupParent } : {}),
    },
    devices: uuids.map((uuid) => ({
      name: uuid,
      containerEdits: { env: [`NVIDIA_VISIBLE_DEVICES=${visibleDeviceOf(uuid)}`] },
    })),
    containerEdits: { env: [`BCD_ALLOCATION_ID=${allocationId}`, ...sharingEnv] },
  };
  writeAtomic(cdiSpecFile, `${JSON.stringify(spec, null, 2)}\n`);
  writeAtomic(
    envFile,
    [
      `BCD_ALLOCATION_ID=${allocationId}`,
      `NVIDIA_VISIBLE_DEVICES=${visible.join(',')}`,
      `CUDA_VISIBLE_DEVICES=${visible.join(',')}`,
      `BCD_CDI_DEVICES=${uuids.map((u) => `bcd.dev/gpu=${u}`).join(',')}`,
      `BCD_UNTIL=${assignment.until}`,
      ...(assignment.preemptAt !== undefined ? [`BCD_PREEMPT_AT=${assignment.preemptAt}`] : []),
      ...limitLines,
      ...sharingEnv,
      '',
    ].join('\n'),
  );
  writePreemptNotice(roots, assignment);
  return {
    allocationId,
    gpuUuids: uuids,
    cdiDevices: uuids.map((u) => `bcd.dev/gpu=${u}`),
    cdiSpecFile,
    envFile,
    cgroupParent,
    binding: assignment.binding,
  };
}

/** The allocations that have a CDI spec on disk now. */
export function heldAllocationIds(roots: DeviceRoots): string[] {
  try {
    return readdirSync(roots.cdiDir)
      .filter((f) => f.startsWith('bcd-') && f.endsWith('.json'))
      .map((f) => f.slice(4, -5));
  } catch {
    return [];
  }
}

/** Where a spot allocation's preemption notice is written: `<allocation>.preempt`, beside its env file. */
export function preemptFileFor(roots: DeviceRoots, allocationId: string): string {
  return path.join(roots.envDir, `${allocationId}.preempt`);
}

/**
 * The preemption notice of a spot allocation, where its workload can see it (so a training job
 * can checkpoint): `<allocation>.preempt` holds `BCD_PREEMPT_AT=<epoch ms>` and the ISO time;
 * without a notice the file is removed.
 */
function writePreemptNotice(roots: DeviceRoots, assignment: DeviceAssignment): void {
  const file = preemptFileFor(roots, assignment.allocationId);
  if (assignment.preemptAt === undefined) {
    rmSync(file, { force: true });
    return;
  }
  const at = assignment.preemptAt;
  writeAtomic(file, `BCD_PREEMPT_AT=${at}\nBCD_PREEMPT_AT_ISO=${new Date(at).toISOString()}\n`);
}

export function removeHold(roots: DeviceRoots, allocationId: string): void {
  rmSync(preemptFileFor(roots, allocationId), { force: true });
  rmSync(cdiFileFor(roots, allocationId), { force: true });
  rmSync(envFileFor(roots, allocationId), { force: true });
}

/**
 * Converges the disk to the assignments; answers what is held, what was released and what could
 * not be honoured. An assignment is checked before it is written: every atom present and healthy
 * (with `context.gpus`; for one already held: present), and its memory admitted against the host's
 * beside the holds already there (held ones first, then by allocation id). A new assignment that
 * fails is not written; one already held keeps its files (bcd never drops a hold on its own) and is
 * reported failed until it is whole again. Slices of holds no longer assigned are removed once empty (`sweepSlices`, every pass).
 */
export function convergeDevices(
  roots: DeviceRoots,
  assignments: readonly DeviceAssignment[],
  context: HoldContext = {},
): { held: HeldAllocation[]; released: string[]; failed: HoldFailure[] } {
  const already = new Set(heldAllocationIds(roots));
  const ordered = [...assignments].sort(
    (a, b) =>
      Number(already.has(b.allocationId)) - Number(already.has(a.allocationId)) ||
      a.allocationId.localeCompare(b.allocationId),
  );
  const held: HeldAllocation[] = [];
  const failed: HoldFailure[] = [];
  let memory = 0;
  for (const assignment of ordered) {
    const missing = context.gpus
      ? checkAtoms(assignment, context.gpus, { presentOnly: already.has(assignment.allocationId) })
      : null;
    // A kubernetes binding has no slice, but its booked memory still counts against the host.
    const bytes = assignment.limits?.memoryBytes ?? 0;
    const fits = context.hostMemoryBytes === undefined || memory + bytes <= context.hostMemoryBytes;
    const failure: HoldFailure | null = missing
      ? { allocationId: assignment.allocationId, reason: 'device-unavailable', message: missing }
      : !fits
        ? {
            allocationId: assignment.allocationId,
            reason: 'resources-exhausted',
            message: `the hold needs ${bytes} bytes of memory; ${Math.max(0, (context.hostMemoryBytes ?? 0) - memory)} of the host's ${context.hostMemoryBytes} are left beside its other holds`,
          }
        : null;
    if (failure) {
      failed.push(failure);
      if (!already.has(assignment.allocationId)) continue;
    } else memory += bytes;
    try {
      held.push(writeHold(roots, assignment, context));
    } catch (error) {
      if (!context.cgroups) throw error;
      failed.push({
        allocationId: assignment.allocationId,
        reason: 'cgroup-failed',
        message: `could not make the slice: ${(error as Error).message.slice(0, 200)}`,
      });
    }
  }
  const wanted = new Set(assignments.map((a) => a.allocationId));
  const released: string[] = [];
  for (const id of already) {
    if (!wanted.has(id)) {
      removeHold(roots, id);
      released.push(id);
    }
  }
  if (context.cgroups) sweepSlices(context.cgroups, wanted);
  return { held, released, failed };
}

/**
 * Removes every slice of bcd's whose allocation is no longer assigned, once it is empty; a slice
 * still holding processes stays and is tried again on the next pass. Answers the slices left.
 */
export function sweepSlices(cgroups: CgroupDriver, wanted: ReadonlySet<string>): string[] {
  const left: string[] = [];
  for (const slice of cgroups.list()) {
    const allocationId = slice.slice('bcd-alloc-'.length, -'.slice'.length);
    if (wanted.has(allocationId)) continue;
    if (cgroups.remove(slice) === 'busy') left.push(slice);
  }
  return left;
}
