import { readFileSync } from 'node:fs';
import path from 'node:path';
import { describe, expect, it } from 'vitest';
import { convergeDevices } from '../../daemon/devices.ts';
import { SimHardware } from '../../daemon/hardware.ts';
import { migLayoutCommands, parseMigInventory, parseMigList } from '../../daemon/mig.ts';
import { assignmentLimits, formatCpulist, parseCpulist } from '../../domain/host-limits.ts';
import { gpusSectionSchema } from '../../domain/inventory-sections.ts';
import { atomMeter, atomWorth } from '../../domain/sharing.ts';
import { smallH100Shape } from '../support/sim-shapes.ts';
import { useTempDir } from '../support/temp-dir.ts';

const fixture = (name: string) =>
  readFileSync(path.join(import.meta.dirname, '../fixtures/nvidia-smi', name), 'utf8');

describe('MIG inventory from nvidia-smi (captured A100 and H100 output)', () => {
  it('reads an A100 with a mixed layout and a GPU with MIG off', () => {
    const mig = parseMigInventory(fixture('a100-sxm4-40gb-mig.xml'), fixture('a100-sxm4-40gb-mig.L.txt'));
    const on = mig.get('GPU-5d5ba0d6-a5c1-4a57-1b8e-c8d1b9b8e2f1')!;
    expect(on.mode).toBe('enabled');
    expect(on.instances.map((i) => [i.profile, i.gpuInstanceId, i.memoryMiB])).toEqual([
      ['3g.20gb', 2, 19968],
      ['2g.10gb', 3, 9856],
      ['1g.5gb', 9, 4864],
    ]);
    expect(on.instances[0]!.uuid).toBe('MIG-c6d4f1ef-42e4-5de3-91c7-45d71c87eb3f');
    expect(mig.get('GPU-8e1f9c2a-7b4d-4e3f-a6c5-d2b1e0f9a8c7')).toEqual({ mode: 'disabled', instances: [] });
  });

  it('reads an H100 in MIG mode with seven 1g.10gb instances', () => {
    const mig = parseMigInventory(fixture('h100-sxm5-80gb-mig.xml'), fixture('h100-sxm5-80gb-mig.L.txt'));
    const gpu = mig.get('GPU-6f2d5b4a-1c3e-4f5a-9b8c-7d6e5f4a3b2c')!;
    expect(gpu.instances).toHaveLength(7);
    expect(new Set(gpu.instances.map((i) => i.profile))).toEqual(new Set(['1g.10gb']));
    expect(gpu.instances.map((i) => i.gpuInstanceId)).toEqual([7, 8, 9, 11, 12, 13, 14]);
  });

  it('reads the listings real A100 80GB and H100 80GB machines printed, mixed profiles in device order', () => {
    const a100 = parseMigList(fixture('published/a100-80gb-pcie.L.txt'));
    expect([...a100.keys()]).toEqual(['GPU-4101de38-535a-4255-ac14-a63e072d7a10']);
    expect(a100.get('GPU-4101de38-535a-4255-ac14-a63e072d7a10')!.map((d) => d.profile)).toEqual([
      '3g.40gb',
      '2g.20gb',
      '1g.10gb',
      '1g.10gb',
    ]);
    const h100 = parseMigList(fixture('published/h100-80gb-hbm3.L.txt'));
    const devices = h100.get('GPU-b4895dbf-9350-2524-a89b-98161ddd9fe4')!;
    expect(devices.map((d) => d.profile)).toEqual(['3g.40gb', '2g.20gb', '1g.10gb', '1g.10gb']);
    expect(devices[0]!.uuid).toBe('MIG-7089d0f3-293f-58c9-8f8c-5ea666eedbde');
  });

  it('the simulator produces the same shapes, valid against the inventory schema, and applies layouts', () => {
    const real = parseMigInventory(fixture('h100-sxm5-80gb-mig.xml'), fixture('h100-sxm5-80gb-mig.L.txt'));
    const sim = new SimHardware('sim-mig', {
      ...smallH100Shape,
      migProfiles: Array(7).fill('1g.10gb'),
    });
    const section = gpusSectionSchema.parse(sim.gpus());
    const keys = (o: object) => Object.keys(o).sort();
    const realInstance = [...real.values()][0]!.instances[0]!;
    expect(keys(section.gpus[0]!.mig!)).toEqual(keys([...real.values()][0]!));
    expect(keys(section.gpus[0]!.mig!.instances[0]!)).toEqual(keys(realInstance));
    gpusSectionSchema.parse({ gpus: [{ ...section.gpus[0], mig: [...real.values()][0] }] });
    sim.applyMigLayout({ gpus: [{ uuid: section.gpus[1]!.uuid, profiles: ['3g.40gb', '3g.40gb'] }] });
    expect(sim.gpus().gpus[1]!.mig!.instances.map((i) => i.profile)).toEqual(['3g.40gb', '3g.40gb']);
    expect(sim.gpus().gpus[0]!.mig!.instances).toHaveLength(7);
  });

  it('turns a layout into the nvidia-smi commands that make it', () => {
    expect(
      migLayoutCommands({ gpus: [{ uuid: 'GPU-a', profiles: ['3g.40gb', '1g.10gb'] }] }, () => 2),
    ).toEqual([
      ['-i', '2', '-mig', '1'],
      ['mig', '-i', '2', '-dci'],
      ['mig', '-i', '2', '-dgi'],
      ['mig', '-i', '2', '-cgi', '3g.40gb,1g.10gb', '-C'],
    ]);
  });
});

describe('one definition of what a shared atom is worth', () => {
  it('gives the same host share and billing weight per mode (MPS slots are no longer 1/4 billed and 1/10 shared)', () => {
    expect(atomWorth({ deviceClass: 'gpu.slot', mode: 'mps', policy: {} })).toEqual({
      hostShare: 0.1,
      billingWeight: 0.1,
    });
    expect(atomWorth({ deviceClass: 'gpu.slot', mode: 'time-slice', policy: {} }).billingWeight).toBe(0.25);
    expect(
      atomWorth({ deviceClass: 'gpu.slot', mode: 'mps', policy: { sharing: { replicas: 4 } } }).hostShare,
    ).toBe(0.25);
    expect(
      atomWorth({ deviceClass: 'gpu.mig', mode: 'mig', policy: {}, profile: '3g.40gb' }).billingWeight,
    ).toBeCloseTo(3 / 7);
    expect(atomWorth({ deviceClass: 'gpu', mode: 'exclusive', policy: {} })).toEqual({
      hostShare: 1,
      billingWeight: 1,
    });
  });

  it('names a meter per atom kind', () => {
    expect(atomMeter('h100', 'gpu')).toBe('gpu.h100.hours');
    expect(atomMeter('h100', 'gpu.mig', '1g.10gb')).toBe('gpu.h100.mig.1g.10gb.hours');
    expect(atomMeter('h100', 'gpu.slot')).toBe('gpu.h100.slot.hours');
  });
});

describe('host limits', () => {
  const numa = [
    { node: 0, cpus: '0-31', memoryGiB: 128 },
    { node: 1, cpus: '32-63', memoryGiB: 128 },
  ];
  it('puts the cpuset on the devices’ NUMA node without the host’s reserved CPUs', () => {
    expect(
      assignmentLimits({
        booked: { vcpu: 4, memoryGiB: 8, hugepages1Gi: 0 },
        deviceNumaNodes: [0],
        numa,
        reserveVcpu: 2,
      }),
    ).toEqual({ cpuMillis: 4000, memoryBytes: 8 * 1024 ** 3, cpus: '2-31', mems: '0' });
    // Reserved CPUs are the lowest non-isolated ones.
    expect(
      assignmentLimits({
        booked: { vcpu: 4, memoryGiB: 0, hugepages1Gi: 0 },
        deviceNumaNodes: [0],
        numa,
        isolatedCpus: '0-1',
        reserveVcpu: 2,
      })?.cpus,
    ).toBe('0-1,4-31');
  });
  it('leaves the cpuset out where those NUMA nodes cannot carry it, and books nothing for nothing', () => {
    const big = assignmentLimits({
      booked: { vcpu: 40, memoryGiB: 200, hugepages1Gi: 1 },
      deviceNumaNodes: [1],
      numa,
    });
    expect(big).toEqual({ cpuMillis: 40_000, memoryBytes: 200 * 1024 ** 3, hugepages1Gi: 1 });
    expect(
      assignmentLimits({ booked: { vcpu: 0, memoryGiB: 0, hugepages1Gi: 0 }, deviceNumaNodes: [0], numa }),
    ).toBeUndefined();
  });
  it('reads cpulists within bounds', () => {
    expect(parseCpulist('0-3,8,10-11')).toEqual([0, 1, 2, 3, 8, 10, 11]);
    expect(formatCpulist([0, 1, 2, 3, 8, 10, 11])).toBe('0-3,8,10-11');
    expect(parseCpulist('0-9000')).toEqual([]);
    expect(parseCpulist('x')).toEqual([]);
    expect(parseCpulist(Array(5000).fill('1').join(','))).toEqual([]);
  });
});

describe('what bcd checks a hold against', () => {
  const dir = useTempDir('bcd-atoms-');
  const gpu = (uuid: string, health: 'healthy' | 'unhealthy') => ({
    uuid,
    index: 0,
    model: 'NVIDIA H100 80GB HBM3',
    memoryMiB: 81_559,
    nvlinkDomain: null,
    numaNode: 0,
    health,
  });
  const hold = (allocationId: string, uuid: string) => ({
    allocationId,
    deviceIds: ['dev_0'],
    stableIds: [uuid],
    until: 1_800_000_000_000,
    binding: 'hold' as const,
  });
  it('refuses a new hold on an unhealthy GPU, keeps a bound one whose GPU turns unhealthy, and fails one whose GPU is gone', () => {
    const roots = { cdiDir: path.join(dir, 'cdi'), envDir: path.join(dir, 'env') };
    const fresh = convergeDevices(roots, [hold('alloc_new', 'GPU-a')], { gpus: [gpu('GPU-a', 'unhealthy')] });
    expect(fresh.held).toEqual([]);
    expect(fresh.failed).toEqual([
      { allocationId: 'alloc_new', reason: 'device-unavailable', message: 'GPU-a is unhealthy' },
    ]);
    const bound = hold('alloc_bound', 'GPU-b');
    expect(convergeDevices(roots, [bound], { gpus: [gpu('GPU-b', 'healthy')] }).failed).toEqual([]);
    // The workload still has the GPU: AtomUnhealthy (from the inventory), not a lost binding.
    const sick = convergeDevices(roots, [bound], { gpus: [gpu('GPU-b', 'unhealthy')] });
    expect(sick.failed).toEqual([]);
    expect(sick.held.map((h) => h.allocationId)).toEqual(['alloc_bound']);
    const gone = convergeDevices(roots, [bound], { gpus: [] });
    expect(gone.failed).toEqual([
      { allocationId: 'alloc_bound', reason: 'device-unavailable', message: 'GPU-b is missing' },
    ]);
    expect(gone.held.map((h) => h.allocationId)).toEqual(['alloc_bound']);
  });
});
