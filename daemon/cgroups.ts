import { execFileSync } from 'node:child_process';
import {
  existsSync,
  mkdirSync,
  readdirSync,
  readFileSync,
  rmdirSync,
  rmSync,
  statfsSync,
  writeFileSync,
} from 'node:fs';
import path from 'node:path';

/**
 * Host resource enforcement with real cgroups. bcd detects which hierarchy the machine has and
 * puts each hold's limits into a slice `bcd-alloc-<allocation>.slice`:
 *
 * - `v2`: a plain cgroup v2 mount; the slice is a directory under `<mount>/<root>/` with
 *   `memory.max`, `memory.swap.max`, `cpu.max`, `cpuset.cpus`, `cpuset.mems`, `hugetlb.1GB.max`
 *   (the controllers enabled down the path through `cgroup.subtree_control`);
 * - `v2-systemd`: cgroup v2 owned by systemd; the slice is a runtime unit in
 *   `/run/systemd/system` (`MemoryMax`, `MemorySwapMax`, `CPUQuota`, `AllowedCPUs`,
 *   `AllowedMemoryNodes`) started with `systemctl`, so systemd never fights bcd over the tree;
 * - `v1`: one directory per controller (`memory`, `cpu`, `cpuset`, `hugetlb`) under
 *   `<mount>/<controller>/<root>/`, with `memory.limit_in_bytes` (and `memory.memsw.limit_in_bytes`
 *   when swap accounting is on), `cpu.cfs_quota_us`/`cpu.cfs_period_us`, `cpuset.cpus`,
 *   `cpuset.mems`, `hugetlb.1GB.limit_in_bytes`.
 *
 * The kernel enforces them: a process in the slice past `memory` is OOM-killed, CPU time past the
 * quota is throttled, and it runs only on the cpuset's CPUs.
 */

export type CgroupFlavor = 'v2' | 'v2-systemd' | 'v1';

export interface CgroupLimits {
  cpuMillis?: number | undefined;
  memoryBytes?: number | undefined;
  hugepages1Gi?: number | undefined;
  cpus?: string | undefined;
  mems?: string | undefined;
}

/** What a slice holds now, read back from cgroupfs. */
export interface SliceReadback {
  memoryBytes: number | null;
  cpuQuotaUs: number | null;
  cpuPeriodUs: number | null;
  cpus: string;
  mems: string;
}

export interface CgroupDriver {
  readonly flavor: CgroupFlavor;
  /** Creates the slice or updates its limits (idempotent). */
  apply(slice: string, limits: CgroupLimits): void;
  /** Removes an empty slice: `busy` while processes remain in it (try again next pass). */
  remove(slice: string): 'removed' | 'busy' | 'absent';
  exists(slice: string): boolean;
  /** The slices bcd made under its root. */
  list(): string[];
  /** Moves a process into the slice (what a workload manager does; tests use it). */
  addProcess(slice: string, pid: number): void;
  readBack(slice: string): SliceReadback;
  /** The slice's directory per controller (`unified` on v2). */
  directories(slice: string): Record<string, string>;
}

export const slicePattern = /^bcd-alloc-[A-Za-z0-9_-]{1,100}\.slice$/;

/** The slice of one allocation (the control plane keeps a reported slice only when it is exactly this). */
export function sliceName(allocationId: string): string {
  return `bcd-alloc-${allocationId}.slice`;
}

const cgroup2Magic = 0x63677270;
const tmpfsMagic = 0x01021994;

/**
 * Which hierarchy `mount` carries: cgroup2fs at the mount is `v2` (`v2-systemd` when systemd runs
 * the machine), a tmpfs with per-controller cgroup mounts is `v1`; null when neither.
 */
export function detectCgroupFlavor(
  mount = '/sys/fs/cgroup',
  systemdDir = '/run/systemd/system',
): CgroupFlavor | null {
  try {
    const type = statfsSync(mount).type;
    if (type === cgroup2Magic) return existsSync(systemdDir) ? 'v2-systemd' : 'v2';
    if (type === tmpfsMagic && existsSync(path.join(mount, 'memory', 'memory.limit_in_bytes'))) return 'v1';
    // A plain directory shaped like cgroupfs (the simulator's own tree when it may not write the real one).
    if (existsSync(path.join(mount, 'cgroup.controllers'))) return 'v2';
  } catch {
    return null;
  }
  return null;
}

function read(file: string): string {
  try {
    return readFileSync(file, 'utf8').trim();
  } catch {
    return '';
  }
}

function write(file: string, value: string): void {
  writeFileSync(file, value);
}

function checkSlice(slice: string): void {
  if (!slicePattern.test(slice)) throw new Error(`not a bcd slice name: ${slice.slice(0, 120)}`);
}

function numberOrNull(text: string): number | null {
  if (text === '' || text === 'max') return null;
  const n = Number(text);
  return Number.isFinite(n) && n >= 0 && n < 2 ** 62 ? n : null;
}

const periodUs = 100_000;

class V1Driver implements CgroupDriver {
  readonly flavor = 'v1' as const;
  constructor(
    private readonly mount: string,
    private readonly root: string,
  ) {}

  private controllers(): string[] {
    return ['memory', 'cpu', 'cpuset', 'hugetlb'].filter((c) => existsSync(path.join(this.mount, c)));
  }

  directories(slice: string): Record<string, string> {
    return Object.fromEntries(this.controllers().map((c) => [c, path.join(this.mount, c, this.root, slice)]));
  }

  /** mkdir -p under a controller; a new cpuset directory starts with its parent's cpus and mems. */
  private ensure(controller: string, dir: string): void {
    const base = path.join(this.mount, controller);
    const rel = path.relative(base, dir).split(path.sep);
    let current = base;
    for (const part of rel) {
      const parent = current;
      current = path.join(current, part);
      if (!existsSync(current)) mkdirSync(current);
      if (controller === 'cpuset') {
        for (const f of ['cpuset.cpus', 'cpuset.mems']) {
          if (read(path.join(current, f)) === '') write(path.join(current, f), read(path.join(parent, f)));
        }
      }
    }
  }

  apply(slice: string, limits: CgroupLimits): void {
    checkSlice(slice);
    const dirs = this.directories(slice);
    for (const [controller, dir] of Object.entries(dirs)) this.ensure(controller, dir);
    if (dirs.memory) {
      const limit = limits.memoryBytes ? String(limits.memoryBytes) : '-1';
      const memsw = path.join(dirs.memory, 'memory.memsw.limit_in_bytes');
      const mem = path.join(dirs.memory, 'memory.limit_in_bytes');
      // memory ≤ memsw always holds: raise memsw first when growing, lower memory first when shrinking.
      if (existsSync(memsw)) {
        try {
          write(mem, limit);
          write(memsw, limit);
        } catch {
          write(memsw, limit);
          write(mem, limit);
        }
      } else write(mem, limit);
    }
    if (dirs.cpu) {
      write(path.join(dirs.cpu, 'cpu.cfs_period_us'), String(periodUs));
      write(
        path.join(dirs.cpu, 'cpu.cfs_quota_us'),
        limits.cpuMillis ? String(Math.max(1000, Math.round((limits.cpuMillis * periodUs) / 1000))) : '-1',
      );
    }
    if (dirs.cpuset) {
      const parent = path.dirname(dirs.cpuset);
      write(path.join(dirs.cpuset, 'cpuset.cpus'), limits.cpus || read(path.join(parent, 'cpuset.cpus')));
      write(path.join(dirs.cpuset, 'cpuset.mems'), limits.mems || read(path.join(parent, 'cpuset.mems')));
    }
    const huge = dirs.hugetlb ? path.join(dirs.hugetlb, 'hugetlb.1GB.limit_in_bytes') : null;
    if (huge && existsSync(huge))
      write(huge, limits.hugepages1Gi ? String(limits.hugepages1Gi * 1024 ** 3) : '-1');
  }

  exists(slice: string): boolean {
    return Object.values(this.directories(slice)).some((d) => existsSync(d));
  }

  remove(slice: string): 'removed' | 'busy' | 'absent' {
    checkSlice(slice);
    const dirs = Object.values(this.directories(slice)).filter((d) => existsSync(d));
    if (dirs.length === 0) return 'absent';
    if (dirs.some((d) => read(path.join(d, 'cgroup.procs')) !== '')) return 'busy';
    for (const d of dirs) rmdirSync(d);
    return 'removed';
  }

  list(): string[] {
    const dir = path.join(this.mount, 'memory', this.root);
    return existsSync(dir) ? readdirSync(dir).filter((f) => slicePattern.test(f)) : [];
  }

  addProcess(slice: string, pid: number): void {
    for (const dir of Object.values(this.directories(slice)))
      write(path.join(dir, 'cgroup.procs'), String(pid));
  }

  readBack(slice: string): SliceReadback {
    const d = this.directories(slice);
    const mem = numberOrNull(read(path.join(d.memory ?? '', 'memory.limit_in_bytes')));
    const quota = Number(read(path.join(d.cpu ?? '', 'cpu.cfs_quota_us')));
    return {
      memoryBytes: mem !== null && mem < 2 ** 62 - 4096 ? mem : null,
      cpuQuotaUs: Number.isFinite(quota) && quota > 0 ? quota : null,
      cpuPeriodUs: numberOrNull(read(path.join(d.cpu ?? '', 'cpu.cfs_period_us'))),
      cpus: read(path.join(d.cpuset ?? '', 'cpuset.cpus')),
      mems: read(path.join(d.cpuset ?? '', 'cpuset.mems')),
    };
  }
}

class V2Driver implements CgroupDriver {
  readonly flavor = 'v2' as const;
  constructor(
    private readonly mount: string,
    private readonly root: string,
  ) {}

  directories(slice: string): Record<string, string> {
    return { unified: path.join(this.mount, this.root, slice) };
  }

  /** mkdir -p, enabling the controllers bcd needs in every ancestor's subtree_control. */
  private ensure(dir: string): void {
    const rel = path.relative(this.mount, dir).split(path.sep);
    let current = this.mount;
    for (const part of rel) {
      const available = read(path.join(current, 'cgroup.controllers')).split(/\s+/);
      const wanted = ['cpu', 'memory', 'cpuset', 'hugetlb'].filter((c) => available.includes(c));
      const enabled = read(path.join(current, 'cgroup.subtree_control')).split(/\s+/);
      const missing = wanted.filter((c) => !enabled.includes(c));
      if (missing.length > 0)
        write(path.join(current, 'cgroup.subtree_control'), missing.map((c) => `+${c}`).join(' '));
      current = path.join(current, part);
      if (!existsSync(current)) mkdirSync(current);
    }
  }

  apply(slice: string, limits: CgroupLimits): void {
    checkSlice(slice);
    const dir = this.directories(slice).unified!;
    this.ensure(dir);
    const set = (file: string, value: string) => {
      const f = path.join(dir, file);
      if (existsSync(f) || !existsSync(path.join(this.mount, 'cgroup.procs'))) write(f, value);
    };
    set('memory.max', limits.memoryBytes ? String(limits.memoryBytes) : 'max');
    if (limits.memoryBytes) set('memory.swap.max', '0');
    set(
      'cpu.max',
      limits.cpuMillis
        ? `${Math.max(1000, Math.round((limits.cpuMillis * periodUs) / 1000))} ${periodUs}`
        : `max ${periodUs}`,
    );
    if (limits.cpus) set('cpuset.cpus', limits.cpus);
    if (limits.mems) set('cpuset.mems', limits.mems);
    if (limits.hugepages1Gi) set('hugetlb.1GB.max', String(limits.hugepages1Gi * 1024 ** 3));
  }

  exists(slice: string): boolean {
    return existsSync(this.directories(slice).unified!);
  }

  remove(slice: string): 'removed' | 'busy' | 'absent' {
    checkSlice(slice);
    const dir = this.directories(slice).unified!;
    if (!existsSync(dir)) return 'absent';
    if (read(path.join(dir, 'cgroup.procs')) !== '') return 'busy';
    try {
      rmdirSync(dir);
    } catch (error) {
      // A plain directory standing in for cgroupfs holds real files; the kernel's holds none.
      if ((error as NodeJS.ErrnoException).code !== 'ENOTEMPTY') throw error;
      rmSync(dir, { recursive: true, force: true });
    }
    return 'removed';
  }

  list(): string[] {
    const dir = path.join(this.mount, this.root);
    return existsSync(dir) ? readdirSync(dir).filter((f) => slicePattern.test(f)) : [];
  }

  addProcess(slice: string, pid: number): void {
    write(path.join(this.directories(slice).unified!, 'cgroup.procs'), String(pid));
  }

  readBack(slice: string): SliceReadback {
    const dir = this.directories(slice).unified!;
    const [quota, period] = read(path.join(dir, 'cpu.max')).split(/\s+/);
    return {
      memoryBytes: numberOrNull(read(path.join(dir, 'memory.max'))),
      cpuQuotaUs: numberOrNull(quota ?? ''),
      cpuPeriodUs: numberOrNull(period ?? ''),
      cpus: read(path.join(dir, 'cpuset.cpus')),
      mems: read(path.join(dir, 'cpuset.mems')),
    };
  }
}

/** The runtime unit of a slice under systemd: its properties are the hold's limits. */
export function systemdSliceUnit(limits: CgroupLimits): string {
  const lines = ['[Unit]', 'Description=bcd hold', '', '[Slice]'];
  if (limits.memoryBytes) lines.push(`MemoryMax=${limits.memoryBytes}`, 'MemorySwapMax=0');
  if (limits.cpuMillis) lines.push(`CPUQuota=${Math.round(limits.cpuMillis / 10)}%`);
  if (limits.cpus) lines.push(`AllowedCPUs=${limits.cpus}`);
  if (limits.mems) lines.push(`AllowedMemoryNodes=${limits.mems}`);
  return `${lines.join('\n')}\n`;
}

/** Where systemd puts a slice: `bcd-alloc-x.slice` nests as `bcd.slice/bcd-alloc.slice/bcd-alloc-x.slice`. */
export function systemdSlicePath(slice: string): string {
  const stem = slice.replace(/\.slice$/, '').split('-');
  return stem.map((_, i) => `${stem.slice(0, i + 1).join('-')}.slice`).join('/');
}

class SystemdDriver implements CgroupDriver {
  readonly flavor = 'v2-systemd' as const;
  private readonly v2: V2Driver;
  constructor(
    mount: string,
    private readonly unitDir: string,
    private readonly systemctl: (args: string[]) => void,
  ) {
    this.v2 = new V2Driver(mount, '');
  }

  directories(slice: string): Record<string, string> {
    return this.v2.directories(systemdSlicePath(slice));
  }

  apply(slice: string, limits: CgroupLimits): void {
    checkSlice(slice);
    mkdirSync(this.unitDir, { recursive: true });
    const file = path.join(this.unitDir, slice);
    const unit = systemdSliceUnit(limits);
    if (read(file) !== unit.trim()) {
      write(file, unit);
      this.systemctl(['daemon-reload']);
    }
    this.systemctl(['start', slice]);
  }

  exists(slice: string): boolean {
    return existsSync(this.directories(slice).unified!);
  }

  remove(slice: string): 'removed' | 'busy' | 'absent' {
    checkSlice(slice);
    const dir = this.directories(slice).unified!;
    const file = path.join(this.unitDir, slice);
    if (!existsSync(dir) && !existsSync(file)) return 'absent';
    if (existsSync(dir) && read(path.join(dir, 'cgroup.procs')) !== '') return 'busy';
    this.systemctl(['stop', slice]);
    rmSync(file, { force: true });
    this.systemctl(['daemon-reload']);
    return 'removed';
  }

  list(): string[] {
    return existsSync(this.unitDir) ? readdirSync(this.unitDir).filter((f) => slicePattern.test(f)) : [];
  }

  addProcess(slice: string, pid: number): void {
    write(path.join(this.directories(slice).unified!, 'cgroup.procs'), String(pid));
  }

  readBack(slice: string): SliceReadback {
    return new V2Driver(path.dirname(this.directories(slice).unified!), '').readBack(path.basename(slice));
  }
}

/**
 * The driver for this machine: `flavor` as detected at `mount` unless given. `root` is the
 * sub-tree bcd keeps its slices in (`bcd` on a node; the simulator gives each node its own).
 * Null when no hierarchy is found.
 */
export function createCgroupDriver(input: {
  mount?: string;
  root?: string;
  flavor?: CgroupFlavor;
  systemdUnitDir?: string;
  systemctl?: (args: string[]) => void;
}): CgroupDriver | null {
  const mount = input.mount ?? '/sys/fs/cgroup';
  const flavor = input.flavor ?? detectCgroupFlavor(mount);
  const root = input.root ?? 'bcd';
  switch (flavor) {
    case 'v1':
      return new V1Driver(mount, root);
    case 'v2':
      return new V2Driver(mount, root);
    case 'v2-systemd':
      return new SystemdDriver(
        mount,
        input.systemdUnitDir ?? '/run/systemd/system',
        input.systemctl ?? ((args) => execFileSync('systemctl', args, { stdio: 'ignore', timeout: 30_000 })),
      );
    case null:
    case undefined:
      return null;
  }
}

/**
 * Whether this process can create cgroups under `mount` (root on a writable hierarchy): probes by
 * creating and removing a child. Answers the reason when it cannot.
 */
export function cgroupsWritable(
  mount = '/sys/fs/cgroup',
): { ok: true; flavor: CgroupFlavor } | { ok: false; reason: string } {
  const flavor = detectCgroupFlavor(mount);
  if (!flavor) return { ok: false, reason: `no cgroup v1 or v2 hierarchy at ${mount}` };
  if (flavor === 'v2-systemd') {
    // systemd owns the tree: writing needs root and a running systemd; bcd asks systemctl.
    if (process.getuid?.() !== 0) return { ok: false, reason: 'not root: systemd slices need root' };
    return { ok: true, flavor };
  }
  const probeDir =
    flavor === 'v1'
      ? path.join(mount, 'memory', `bcd-probe-${process.pid}`)
      : path.join(mount, `bcd-probe-${process.pid}`);
  try {
    mkdirSync(probeDir);
    rmdirSync(probeDir);
    return { ok: true, flavor };
  } catch (error) {
    return {
      ok: false,
      reason: `cannot create a cgroup under ${mount} (${(error as NodeJS.ErrnoException).code ?? 'error'}; run as root)`,
    };
  }
}
