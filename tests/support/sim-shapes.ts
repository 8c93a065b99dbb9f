import type { SimShape } from '../../daemon/hardware.ts';

/** A small simulated H100 server (2 GPUs in one NVLink domain, one NUMA node), quick to boot in tests and benchmarks. */
export const smallH100Shape: SimShape = {
  gpus: 2,
  gpuModel: 'NVIDIA H100 80GB HBM3',
  gpuMemoryMiB: 81_559,
  nvlinkDomainSize: 2,
  numaNodes: 1,
  vcpu: 32,
  memoryGiB: 256,
  hugepages1Gi: 0,
};
