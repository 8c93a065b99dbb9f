import { execFile, execFileSync } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { cpus, hostname, networkInterfaces, totalmem } from 'node:os';
import { promisify } from 'node:util';
import type { GpuInventory, GpusSection, HostSection } from '../domain/inventory-sections.ts';
import type { MigLayoutSettings } from '../domain/node-spec.ts';
import type { HardwareEvidence } from '../proto/gen/agent/v1/agent.ts';
import type { Hardware } from './hardware.ts';
import { migLayoutCommands, readMigInventory } from './mig.ts';
import { readIsolatedCpus, readNumaNodes, readPciNumaNode } from './numa-sysfs.ts';

const run = promisify(execFile);

/** The query bcd runs: `nvidia-smi --query-gpu=<these> --format=csv,noheader,nounits`. */
export const gpuQueryFields = ['index', 'uuid', 'name', 'memory.total', 'pci.bus_id', 'serial'] as const;

/** Parses the CSV answer of the GPU query (captured output in tests). */
export function parseGpuQuery(
  csv: string,
): Array<Omit<GpuInventory, 'nvlinkDomain' | 'numaNode'> & { serial: string }> {
  const gpus = [];
  for (const line of csv.split('\n')) {
    if (!line.trim()) continue;
    const [index, uuid, name, memory, busId, serial] = line.split(',').map((f) => f.trim());
    if (!uuid?.startsWith('GPU-')) throw new Error(`unexpected nvidia-smi line: ${line.slice(0, 100)}`);
    gpus.push({
      index: Number(index),
      uuid,
      model: name ?? 'unknown',
      memoryMiB: Number.parseInt(memory ?? '0', 10) || 0,
      pciBusId: busId ?? '',
      serial: serial ?? '',
      health: 'healthy' as const,
    });
  }
  return gpus;
}

/**
 * Parses `nvidia-smi topo -m` into NVLink domains (connected components over `NV#` links) and
 * NUMA affinity per GPU index.
 */
export function parseTopology(
  matrix: string,
): Map<number, { nvlinkDomain: string | null; numaNode: number }> {
  const all = matrix.split('\n');
  const header = (all.find((l) => /^\s*GPU0\b/.test(l) && !/^GPU0\s/.test(l)) ?? '')
    .split('\t')
    .map((c) => c.trim());
  const rows = all.filter((l) => /^GPU\d+\s/.test(l)).map((l) => l.split('\t').map((c) => c.trim()));
  const numaColumn = header.indexOf('NUMA Affinity');
  const parent = new Map<number, number>();
  const find = (x: number): number => {
    const p = parent.get(x) ?? x;
    if (p === x) return x;
    const root = find(p);
    parent.set(x, root);
    return root;
  };
  const numa = new Map<number, number>();
  const linked = new Set<number>();
  for (const cells of rows) {
    const gpu = Number(cells[0]!.slice(3));
    if (!parent.has(gpu)) parent.set(gpu, gpu);
    header.forEach((name, col) => {
      if (/^GPU\d+$/.test(name) && /^NV\d+$/.test(cells[col] ?? '')) {
        const other = Number(name.slice(3));
        if (!parent.has(other)) parent.set(other, other);
        parent.set(find(other), find(gpu));
        linked.add(gpu).add(other);
      }
    });
    const value = numaColumn >= 0 ? Number.parseInt(cells[numaColumn] ?? '', 10) : Number.NaN;
    numa.set(gpu, Number.isFinite(value) ? value : -1);
  }
  const out = new Map<number, { nvlinkDomain: string | null; numaNode: number }>();
  for (const gpu of parent.keys()) {
    out.set(gpu, {
      nvlinkDomain: linked.has(gpu) ? `nvl-${find(gpu)}` : null,
      numaNode: numa.get(gpu) ?? -1,
    });
  }
  return out;
}

function readFirst(file: string): string {
  try {
    return readFileSync(file, 'utf8').trim();
  } catch {
    return '';
  }
}

/**
 * A real host: GPUs from `nvidia-smi`, identity from DMI, CPUs and memory from the OS, NUMA nodes
 * (their CPUs, memory, and each GPU's node) from sysfs under `sysRoot` (default `/`).
 */
export class NvidiaSmiHardware implements Hardware {
  private cached: GpusSection = { gpus: [] };

  constructor(private readonly options: { sysRoot?: string } = {}) {}

  private get sysRoot(): string {
    return this.options.sysRoot ?? '/';
  }

  async refresh(): Promise<void> {
    const query = await run('nvidia-smi', [
      `--query-gpu=${gpuQueryFields.join(',')}`,
      '--format=csv,noheader,nounits',
    ]).catch((error: NodeJS.ErrnoException) => {
      // A host without the NVIDIA driver is a CPU-only node: no GPUs, not an error.
      if (error.code === 'ENOENT') return { stdout: '' };
      throw error;
    });
    const topo = await run('nvidia-smi', ['topo', '-m']).catch(() => ({ stdout: '' }));
    const topology = parseTopology(topo.stdout);
    const numa = readNumaNodes(this.sysRoot);
    this.cached = this.withMig(
      parseGpuQuery(query.stdout).map(({ serial: _serial, ...g }) => {
        // The kernel's word for the GPU's PCI device first; `topo -m` only where sysfs has none.
        const fromSysfs = g.pciBusId ? readPciNumaNode(this.sysRoot, g.pciBusId, numa) : -1;
        return {
          ...g,
          nvlinkDomain: topology.get(g.index)?.nvlinkDomain ?? null,
          numaNode: fromSysfs >= 0 ? fromSysfs : (topology.get(g.index)?.numaNode ?? -1),
        };
      }),
    );
  }

  private withMig(gpus: GpusSection['gpus']): GpusSection {
    const mig = gpus.length > 0 ? readMigInventory() : new Map();
    return { gpus: gpus.map((g) => (mig.has(g.uuid) ? { ...g, mig: mig.get(g.uuid) } : g)) };
  }

  /** Applies a `mig-layout` with nvidia-smi (synchronously: the spec's status waits for it). */
  applyMigLayout(settings: MigLayoutSettings): void {
    const indexOf = (uuid: string) => {
      const gpu = this.cached.gpus.find((g) => g.uuid === uuid);
      if (!gpu) throw new Error(`no GPU ${uuid}`);
      return gpu.index;
    };
    for (const args of migLayoutCommands(settings, indexOf)) {
      execFileSync('nvidia-smi', args, { stdio: 'ignore', timeout: 120_000 });
    }
    this.cached = this.withMig(this.cached.gpus.map(({ mig: _mig, ...g }) => g));
  }

  evidence(): HardwareEvidence {
    const macs = Object.entries(networkInterfaces())
      .filter(([name]) => !name.startsWith('lo') && !name.startsWith('docker') && !name.startsWith('veth'))
      .flatMap(([, addrs]) => (addrs ?? []).map((a) => a.mac));
    return {
      productUuid: readFirst('/sys/class/dmi/id/product_uuid'),
      serialNumber: readFirst('/sys/class/dmi/id/product_serial'),
      macs: [...new Set(macs)],
      gpuUuids: this.cached.gpus.map((g) => g.uuid),
      hostname: hostname(),
    };
  }

  gpus(): GpusSection {
    return this.cached;
  }

  host(): HostSection {
    const numa = readNumaNodes(this.sysRoot);
    const isolatedCpus = readIsolatedCpus(this.sysRoot);
    return {
      hostname: hostname(),
      vcpu: cpus().length,
      memoryGiB: Math.floor(totalmem() / 1024 ** 3),
      hugepages1Gi: 0,
      pciGpuCount: this.cached.gpus.length,
      ...(numa.length > 0 ? { numa } : {}),
      ...(isolatedCpus ? { isolatedCpus } : {}),
    };
  }

  /** `nvidia-smi` health queries: a GPU passes when it answers and reports no retired-page fault. */
  async diagnose(_level: string): Promise<Array<{ uuid: string; passed: boolean }>> {
    await this.refresh();
    return this.cached.gpus.map((g) => ({ uuid: g.uuid, passed: g.health === 'healthy' }));
  }

  async resetGpu(uuid: string): Promise<void> {
    await run('nvidia-smi', ['--gpu-reset', '-i', uuid]);
  }
}
