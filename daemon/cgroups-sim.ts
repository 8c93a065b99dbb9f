import { createHash } from 'node:crypto';
import { mkdirSync, rmdirSync, writeFileSync } from 'node:fs';
import { cpus } from 'node:os';
import path from 'node:path';
import { formatCpulist, parseCpulist } from '../domain/host-limits.ts';
import { type CgroupDriver, type CgroupLimits, cgroupsWritable, createCgroupDriver } from './cgroups.ts';
import type { SimHardware } from './hardware.ts';

/**
 * The simulator's slices. Run as root on a writable hierarchy, each simulated node makes its
 * slices in a sub-tree of the machine's real cgroupfs (`bcd-sim/<root tag>/<node>`), where the
 * kernel enforces them like on a node. Otherwise they go into a directory shaped like cgroup v2
 * under the node's state directory (`<dir>/cgroupfs`): the files are the same, nothing enforces
 * them, and the host section says `cgroup: 'none'`.
 */
export function simulatorCgroups(
  hardware: SimHardware,
  input: { dir: string; name: string },
  mount = '/sys/fs/cgroup',
): CgroupDriver {
  const writable = cgroupsWritable(mount);
  if (writable.ok && writable.flavor !== 'v2-systemd') {
    const tag = createHash('sha256').update(path.resolve(input.dir)).digest('hex').slice(0, 8);
    const driver = createCgroupDriver({ mount, root: path.join('bcd-sim', tag, input.name) });
    if (driver) {
      hardware.cgroup = driver.flavor;
      return onThisMachine(driver);
    }
  }
  const fake = path.join(input.dir, 'cgroupfs');
  mkdirSync(fake, { recursive: true });
  writeFileSync(path.join(fake, 'cgroup.controllers'), 'cpuset cpu memory hugetlb\n');
  hardware.cgroup = 'none';
  return createCgroupDriver({ mount: fake, root: 'bcd', flavor: 'v2' })!;
}

/**
 * A simulated node's cpuset names its fake NUMA topology's CPUs: on the real kernel the slice gets
 * those of them this machine has (all of its CPUs when none are), and memory node 0.
 */
function onThisMachine(driver: CgroupDriver): CgroupDriver {
  const machine = cpus().map((_, i) => i);
  const cutToMachine = (limits: CgroupLimits): CgroupLimits => {
    if (!limits.cpus && !limits.mems) return limits;
    const have = parseCpulist(limits.cpus ?? '').filter((c) => c < machine.length);
    return {
      ...limits,
      ...(limits.cpus ? { cpus: formatCpulist(have.length > 0 ? have : machine) } : {}),
      ...(limits.mems ? { mems: '0' } : {}),
    };
  };
  return Object.assign(Object.create(driver) as CgroupDriver, {
    apply: (slice: string, limits: CgroupLimits) => driver.apply(slice, cutToMachine(limits)),
  });
}

/**
 * When a simulated fleet stops, its nodes' slices go with it (a simulated node's holds have no
 * processes of their own): each empty slice and the node's sub-tree are removed; a slice something
 * was put in stays.
 */
export function removeSimulatorCgroups(driver: CgroupDriver): void {
  for (const slice of driver.list()) driver.remove(slice);
  for (const dir of Object.values(driver.directories('bcd-alloc-x.slice'))) {
    // The node's directory, then its tag's and bcd-sim's when nothing else is left in them.
    let current = path.dirname(dir);
    for (let i = 0; i < 3; i++) {
      try {
        rmdirSync(current);
      } catch {
        break;
      }
      current = path.dirname(current);
    }
  }
}
