import path from 'node:path';
import { describe, expect, it } from 'vitest';
import {
  readIsolatedCpus,
  readNumaNodes,
  readPciNumaNode,
  sysfsPciAddress,
} from '../../daemon/numa-sysfs.ts';
import { NvidiaSmiHardware } from '../../daemon/nvidia-smi.ts';
import { assignmentLimits } from '../../domain/host-limits.ts';
import { hostSectionSchema } from '../../domain/inventory-sections.ts';

/** sysfs trees of two machines, as files: a two-socket DGX H100 (with a memory-only node) and a one-node workstation. */
const root = (name: string) => path.join(import.meta.dirname, '../fixtures/sysfs', name);
const dgx = root('dgx-h100-2socket');
const workstation = root('workstation-1node');

describe('a real node’s NUMA layout from sysfs', () => {
  it('reads each NUMA node’s cpulist and memory, leaving out memory-only nodes', () => {
    expect(readNumaNodes(dgx)).toEqual([
      { node: 0, cpus: '0-55,112-167', memoryGiB: 1007 },
      { node: 1, cpus: '56-111,168-223', memoryGiB: 1007 },
    ]);
    expect(readNumaNodes(workstation)).toEqual([{ node: 0, cpus: '0-31', memoryGiB: 125 }]);
    expect(readNumaNodes(root('no-such-machine'))).toEqual([]);
  });

  it('finds a GPU’s NUMA node from its PCI device, from nvidia-smi’s bus id', () => {
    expect(sysfsPciAddress('00000000:9A:00.0')).toBe('0000:9a:00.0');
    expect(sysfsPciAddress('not a bus id')).toBeNull();
    const nodes = readNumaNodes(dgx);
    expect(readPciNumaNode(dgx, '00000000:18:00.0', nodes)).toBe(0);
    expect(readPciNumaNode(dgx, '00000000:AB:00.0', nodes)).toBe(1);
    expect(readPciNumaNode(dgx, '00000000:FF:00.0', nodes)).toBe(-1);
    // The kernel says -1 on a host without NUMA: its only node is the GPU's.
    expect(readPciNumaNode(workstation, '00000000:01:00.0', readNumaNodes(workstation))).toBe(0);
  });

  it('reads isolated CPUs, and none when the file is empty', () => {
    expect(readIsolatedCpus(workstation)).toBe('30-31');
    expect(readIsolatedCpus(dgx)).toBeNull();
  });

  it('a real node’s host inventory carries them, so its holds get a cpuset on their GPUs’ node', () => {
    const host = hostSectionSchema.parse(new NvidiaSmiHardware({ sysRoot: dgx }).host());
    expect(host.numa).toEqual(readNumaNodes(dgx));
    expect(host.isolatedCpus).toBeUndefined();
    const gpuNode = readPciNumaNode(dgx, '00000000:9A:00.0', host.numa!);
    expect(
      assignmentLimits({
        booked: { vcpu: 8, memoryGiB: 64, hugepages1Gi: 0 },
        deviceNumaNodes: [gpuNode],
        numa: host.numa!,
        reserveVcpu: 2,
      }),
    ).toEqual({ cpuMillis: 8000, memoryBytes: 64 * 1024 ** 3, cpus: '56-111,168-223', mems: '1' });
    const small = hostSectionSchema.parse(new NvidiaSmiHardware({ sysRoot: workstation }).host());
    expect(small.isolatedCpus).toBe('30-31');
    // The reserved CPUs (the lowest two not isolated) are never in the cpuset.
    expect(
      assignmentLimits({
        booked: { vcpu: 4, memoryGiB: 0, hugepages1Gi: 0 },
        deviceNumaNodes: [0],
        numa: small.numa!,
        isolatedCpus: small.isolatedCpus!,
        reserveVcpu: 2,
      })?.cpus,
    ).toBe('2-31');
  });
});
