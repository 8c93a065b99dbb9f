import { mkdirSync, readdirSync, renameSync, rmSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import type { DeviceAssignment } from '../domain/node-spec.ts';

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
}

const allocationPattern = /^[A-Za-z0-9_-]{1,100}$/;
const uuidPattern = /^[A-Za-z0-9-]{1,200}$/;

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
export function writeHold(roots: DeviceRoots, assignment: DeviceAssignment): HeldAllocation {
  const { allocationId } = assignment;
  if (!allocationPattern.test(allocationId) || !assignment.stableIds.every((u) => uuidPattern.test(u))) {
    throw new Error(`refusing assignment with unsafe ids: ${allocationId.slice(0, 100)}`);
  }
  mkdirSync(roots.cdiDir, { recursive: true });
  mkdirSync(roots.envDir, { recursive: true });
  const uuids = [...assignment.stableIds];
  const cdiSpecFile = cdiFileFor(roots, allocationId);
  const envFile = envFileFor(roots, allocationId);
  const limits = assignment.limits ?? {};
  const limited = Object.values(limits).some((v) => typeof v === 'number' && v > 0);
  // The slice a workload manager places the workload in; its limits travel in the env file.
  const cgroupParent = limited ? `bcd-alloc-${allocationId}.slice` : '';
  const limitLines = limited
    ? [
        `BCD_CGROUP_PARENT=${cgroupParent}`,
        ...(limits.cpuMillis ? [`BCD_CPU_MILLIS=${limits.cpuMillis}`] : []),
        ...(limits.memoryBytes ? [`BCD_MEMORY_BYTES=${limits.memoryBytes}`] : []),
        ...(limits.hugepages1Gi ? [`BCD_HUGEPAGES_1GI=${limits.hugepages1Gi}`] : []),
      ]
    : [];
  const spec = {
    cdiVersion: '0.6.0',
    kind: 'bcd.dev/gpu',
    annotations: {
      'bcd.dev/allocation': allocationId,
      'bcd.dev/until': String(assignment.until),
      ...(limited ? { 'bcd.dev/cgroup-parent': cgroupParent } : {}),
    },
    devices: uuids.map((uuid) => ({
      name: uuid,
      containerEdits: { env: [`NVIDIA_VISIBLE_DEVICES=${uuid}`] },
    })),
    containerEdits: { env: [`BCD_ALLOCATION_ID=${allocationId}`] },
  };
  writeAtomic(cdiSpecFile, `${JSON.stringify(spec, null, 2)}\n`);
  writeAtomic(
    envFile,
    [
      `BCD_ALLOCATION_ID=${allocationId}`,
      `NVIDIA_VISIBLE_DEVICES=${uuids.join(',')}`,
      `CUDA_VISIBLE_DEVICES=${uuids.join(',')}`,
      `BCD_CDI_DEVICES=${uuids.map((u) => `bcd.dev/gpu=${u}`).join(',')}`,
      `BCD_UNTIL=${assignment.until}`,
      ...limitLines,
      '',
    ].join('\n'),
  );
  return {
    allocationId,
    gpuUuids: uuids,
    cdiDevices: uuids.map((u) => `bcd.dev/gpu=${u}`),
    cdiSpecFile,
    envFile,
    cgroupParent,
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

export function removeHold(roots: DeviceRoots, allocationId: string): void {
  rmSync(cdiFileFor(roots, allocationId), { force: true });
  rmSync(envFileFor(roots, allocationId), { force: true });
}

/** Converges the disk to the assignments; answers what is held and what was released. */
export function convergeDevices(
  roots: DeviceRoots,
  assignments: readonly DeviceAssignment[],
): { held: HeldAllocation[]; released: string[] } {
  const held = assignments.map((a) => writeHold(roots, a));
  const wanted = new Set(assignments.map((a) => a.allocationId));
  const released: string[] = [];
  for (const id of heldAllocationIds(roots)) {
    if (!wanted.has(id)) {
      removeHold(roots, id);
      released.push(id);
    }
  }
  return { held, released };
}
