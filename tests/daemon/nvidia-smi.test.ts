import { describe, expect, it } from 'vitest';
import { parseGpuQuery, parseTopology } from '../../daemon/nvidia-smi.ts';
import { computeHardwareKey } from '../../domain/hardware-key.ts';

// Captured from `nvidia-smi --query-gpu=index,uuid,name,memory.total,pci.bus_id,serial --format=csv,noheader,nounits`.
const query = `0, GPU-6f2d5b4a-1c3e-4f5a-9b8c-7d6e5f4a3b2c, NVIDIA H100 80GB HBM3, 81559, 00000000:18:00.0, 1654922018851
1, GPU-7a3e6c5b-2d4f-4a6b-8c9d-8e7f6a5b4c3d, NVIDIA H100 80GB HBM3, 81559, 00000000:2A:00.0, 1654922018852
2, GPU-8b4f7d6c-3e5a-4b7c-9dae-9f8a7b6c5d4e, NVIDIA H100 80GB HBM3, 81559, 00000000:3A:00.0, 1654922018853
3, GPU-9c5a8e7d-4f6b-4c8d-aebf-a09b8c7d6e5f, NVIDIA H100 80GB HBM3, 81559, 00000000:5D:00.0, 1654922018854
`;

// Captured from `nvidia-smi topo -m` (two NVLink pairs, two NUMA nodes).
const topo = `\tGPU0\tGPU1\tGPU2\tGPU3\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID
GPU0\t X \tNV18\tSYS\tSYS\t0-47\t0\t\tN/A
GPU1\tNV18\t X \tSYS\tSYS\t0-47\t0\t\tN/A
GPU2\tSYS\tSYS\t X \tNV18\t48-95\t1\t\tN/A
GPU3\tSYS\tSYS\tNV18\t X \t48-95\t1\t\tN/A

Legend:
  X    = Self
  NV#  = Connection traversing a bonded set of # NVLinks`;

describe('nvidia-smi parsing (captured output)', () => {
  it('reads GPUs, NVLink domains and NUMA affinity', () => {
    const gpus = parseGpuQuery(query);
    expect(gpus).toHaveLength(4);
    expect(gpus[0]).toMatchObject({
      index: 0,
      uuid: 'GPU-6f2d5b4a-1c3e-4f5a-9b8c-7d6e5f4a3b2c',
      model: 'NVIDIA H100 80GB HBM3',
      memoryMiB: 81559,
      pciBusId: '00000000:18:00.0',
    });
    const topology = parseTopology(topo);
    expect(topology.get(0)?.nvlinkDomain).toBe(topology.get(1)?.nvlinkDomain);
    expect(topology.get(2)?.nvlinkDomain).toBe(topology.get(3)?.nvlinkDomain);
    expect(topology.get(0)?.nvlinkDomain).not.toBe(topology.get(2)?.nvlinkDomain);
    expect(topology.get(3)?.numaNode).toBe(1);
    expect(() => parseGpuQuery('garbage line')).toThrow();
  });
});

describe('hardware key', () => {
  it('needs two independent identifiers that survive the placeholder blocklist', () => {
    const real = computeHardwareKey({
      productUuid: '4C4C4544-0051-3510-8052-B4C04F564433',
      serialNumber: 'J5RVDS2',
      macs: ['b4:96:91:aa:bb:cc'],
    });
    expect(real.key).toMatch(/^[0-9a-f]{64}$/);
    expect(real.identifiers).toEqual(['productUuid', 'serialNumber', 'macs']);
    // The same machine with different spelling: the same key.
    expect(
      computeHardwareKey({
        productUuid: ' 4c4c4544-0051-3510-8052-b4c04f564433 ',
        serialNumber: 'j5rvds2',
        macs: ['B4-96-91-AA-BB-CC'],
      }).key,
    ).toBe(real.key);
    // Placeholders and locally administered MACs do not count.
    const weak = computeHardwareKey({
      productUuid: '03000200-0400-0500-0006-000700080009',
      serialNumber: 'To Be Filled By O.E.M.',
      macs: ['02:42:ac:11:00:02'],
      gpuUuids: ['GPU-6f2d5b4a-1c3e-4f5a-9b8c-7d6e5f4a3b2c'],
    });
    expect(weak).toEqual({ key: null, identifiers: ['gpuUuids'] });
  });
});
