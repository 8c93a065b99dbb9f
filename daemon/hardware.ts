import { createHash } from 'node:crypto';
import { formatCpulist } from '../domain/host-limits.ts';
import type { GpusSection, HostSection, MigInstance } from '../domain/inventory-sections.ts';
import type { MigLayoutSettings } from '../domain/node-spec.ts';
import type { HardwareEvidence } from '../proto/gen/agent/v1/agent.ts';

/** What bcd reads from (and does to) the machine. */
export interface Hardware {
  /** Reads the hardware again (a real host re-runs nvidia-smi); fake hardware has nothing to do. */
  refresh?(): Promise<void>;
  evidence(): HardwareEvidence;
  gpus(): GpusSection;
  host(): HostSection;
  /** Resets one GPU; resolves when done. */
  resetGpu(uuid: string): Promise<void>;
  /** GPU diagnostics: per-GPU pass or fail. */
  diagnose(level: string): Promise<Array<{ uuid: string; passed: boolean }>>;
  /**
   * Puts the named GPUs in MIG mode with exactly these instances (the `mig-layout` config unit),
   * and reads the GPUs again; `gpus()` answers the new instances afterwards.
   */
  applyMigLayout?(settings: MigLayoutSettings): void;
}

/** The shape of a simulated GPU server. */
export interface SimShape {
  gpus: number;
  gpuModel: string;
  gpuMemoryMiB: number;
  /** GPUs per NVLink domain. */
  nvlinkDomainSize: number;
  numaNodes: number;
  vcpu: number;
  memoryGiB: number;
  hugepages1Gi: number;
  /** MIG profiles every GPU starts with (MIG mode on), e.g. seven `1g.10gb`; absent: MIG off. */
  migProfiles?: string[];
}

export const defaultSimShape: SimShape = {
  gpus: 8,
  gpuModel: 'NVIDIA H100 80GB HBM3',
  gpuMemoryMiB: 81_559,
  nvlinkDomainSize: 8,
  numaNodes: 2,
  vcpu: 192,
  memoryGiB: 2048,
  hugepages1Gi: 0,
};

function uuidFrom(seed: string): string {
  const h = createHash('sha256').update(seed).digest('hex');
  return `${h.slice(0, 8)}-${h.slice(8, 12)}-${h.slice(12, 16)}-${h.slice(16, 20)}-${h.slice(20, 32)}`;
}

/**
 * Fake hardware for `bcd sim`: stable identities derived from a seed, GPUs in NVLink domains, and
 * knobs for tests (a GPU that falls off the driver, a slow reset, a log of side effects).
 */
export class SimHardware implements Hardware {
  /** GPUs the driver does not see (the PCI bus still does): GpuCountMismatch. */
  hiddenGpus = 0;
  resetDelayMs = 0;
  diagnoseDelayMs = 0;
  readonly sideEffects: string[] = [];
  onSideEffect?: (entry: string) => void;
  /** The cgroup hierarchy the simulated node enforces holds with (reported in the host section). */
  cgroup: HostSection['cgroup'];
  /** GPUs (by index) the driver reports unhealthy. */
  readonly unhealthyGpus = new Set<number>();
  /** MIG profiles per GPU index, for GPUs in MIG mode. */
  private readonly mig = new Map<number, string[]>();

  constructor(
    readonly seed: string,
    readonly shape: SimShape = defaultSimShape,
  ) {
    if (shape.migProfiles) for (let i = 0; i < shape.gpus; i++) this.mig.set(i, [...shape.migProfiles]);
  }

  /** MIG instances as nvidia-smi lists them: GPU instance ids in placement order, one compute instance each. */
  private migInstances(index: number, profiles: readonly string[]): MigInstance[] {
    return profiles.map((profile, i) => {
      const memoryGb = Number(/\.(\d+)gb/.exec(profile)?.[1] ?? '0');
      return {
        uuid: `MIG-${uuidFrom(`${this.seed}/gpu/${index}/mig/${i}/${profile}`)}`,
        profile,
        gpuInstanceId: i + 1,
        computeInstanceId: 0,
        memoryMiB: memoryGb * 1024 - 256,
      };
    });
  }

  applyMigLayout(settings: MigLayoutSettings): void {
    const gpus = this.allGpus();
    for (const want of settings.gpus) {
      const gpu = gpus.find((g) => g.uuid === want.uuid);
      if (!gpu) throw new Error(`no GPU ${want.uuid}`);
      this.mig.set(gpu.index, [...want.profiles]);
    }
    const entry = `mig.layout ${settings.gpus.map((g) => `${g.uuid}=${g.profiles.join('+')}`).join(' ')}`;
    this.sideEffects.push(entry);
    this.onSideEffect?.(entry);
  }

  evidence(): HardwareEvidence {
    const mac = createHash('sha256').update(`${this.seed}/mac`).digest();
    mac[0] = (mac[0]! & 0xfc) | 0x00; // globally administered unicast
    return {
      productUuid: uuidFrom(`${this.seed}/product`),
      serialNumber: `SIM${createHash('sha256').update(`${this.seed}/serial`).digest('hex').slice(0, 12).toUpperCase()}`,
      macs: [[...mac.subarray(0, 6)].map((b) => b.toString(16).padStart(2, '0')).join(':')],
      gpuUuids: this.allGpus().map((g) => g.uuid),
      hostname: this.seed,
    };
  }

  private allGpus(): GpusSection['gpus'] {
    const { shape } = this;
    return Array.from({ length: shape.gpus }, (_, index) => ({
      uuid: `GPU-${uuidFrom(`${this.seed}/gpu/${index}`)}`,
      index,
      model: shape.gpuModel,
      memoryMiB: shape.gpuMemoryMiB,
      nvlinkDomain: shape.nvlinkDomainSize > 1 ? `nvl-${Math.floor(index / shape.nvlinkDomainSize)}` : null,
      numaNode: Math.floor((index * shape.numaNodes) / Math.max(1, shape.gpus)),
      pciBusId: `00000000:${(0x18 + index * 0x10).toString(16).padStart(2, '0')}:00.0`,
      health: this.unhealthyGpus.has(index) ? ('unhealthy' as const) : ('healthy' as const),
      ...(this.mig.has(index)
        ? { mig: { mode: 'enabled' as const, instances: this.migInstances(index, this.mig.get(index)!) } }
        : {}),
    }));
  }

  gpus(): GpusSection {
    const all = this.allGpus();
    return { gpus: all.slice(0, Math.max(0, all.length - this.hiddenGpus)) };
  }

  host(): HostSection {
    return {
      hostname: this.seed,
      vcpu: this.shape.vcpu,
      memoryGiB: this.shape.memoryGiB,
      hugepages1Gi: this.shape.hugepages1Gi,
      pciGpuCount: this.shape.gpus,
      kernel: 'sim',
      numa: Array.from({ length: Math.max(1, this.shape.numaNodes) }, (_, node) => {
        const per = Math.floor(this.shape.vcpu / Math.max(1, this.shape.numaNodes));
        return {
          node,
          cpus: formatCpulist(Array.from({ length: per }, (_, i) => node * per + i)),
          memoryGiB: Math.floor(this.shape.memoryGiB / Math.max(1, this.shape.numaNodes)),
        };
      }),
      ...(this.cgroup ? { cgroup: this.cgroup } : {}),
    };
  }

  async diagnose(_level: string): Promise<Array<{ uuid: string; passed: boolean }>> {
    if (this.diagnoseDelayMs > 0) await new Promise((r) => setTimeout(r, this.diagnoseDelayMs));
    return this.gpus().gpus.map((g) => ({ uuid: g.uuid, passed: g.health === 'healthy' }));
  }

  async resetGpu(uuid: string): Promise<void> {
    const entry = `gpu.reset ${uuid}`;
    this.sideEffects.push(entry);
    this.onSideEffect?.(entry);
    if (this.resetDelayMs > 0) await new Promise((r) => setTimeout(r, this.resetDelayMs));
  }
}
