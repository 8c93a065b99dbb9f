import { describe, expect, it } from 'vitest';
import {
  type AdvertisedAtom,
  advertisedAtoms,
  preferredAllocation,
  resourceKindOf,
} from '../../daemon/device-plugin-devices.ts';
import type { GpuInventory } from '../../domain/inventory-sections.ts';

const gpu = (
  index: number,
  domain: string | null,
  health: GpuInventory['health'] = 'healthy',
): GpuInventory => ({
  uuid: `GPU-${index}`,
  index,
  model: 'h100',
  memoryMiB: 81_559,
  nvlinkDomain: domain,
  numaNode: index < 4 ? 0 : 1,
  health,
});

// Eight GPUs: domain a holds 0-3, domain b holds 4-5, domain c holds 6-7.
const gpus = [0, 1, 2, 3]
  .map((i) => gpu(i, 'a'))
  .concat([gpu(4, 'b'), gpu(5, 'b'), gpu(6, 'c'), gpu(7, 'c', 'unhealthy')]);
const atoms: AdvertisedAtom[] = advertisedAtoms(
  [{ allocationId: 'alloc_1', stableIds: gpus.map((g) => g.uuid) }],
  gpus,
).get('gpu')!;
const ids = gpus.map((g) => g.uuid);
const domainOf = (id: string) => gpus.find((g) => g.uuid === id)!.nvlinkDomain;

describe('what the device plugin advertises and prefers', () => {
  it('sorts atoms into resource kinds, keeps unhealthy ones as Unhealthy, and carries NUMA nodes', () => {
    expect(resourceKindOf('GPU-1')).toBe('gpu');
    expect(resourceKindOf('MIG-1')).toBe('mig');
    expect(resourceKindOf('GPU-1-slot-3')).toBe('slot');
    expect(atoms).toHaveLength(8);
    expect(atoms.find((a) => a.id === 'GPU-7')).toMatchObject({ health: 'Unhealthy', numaNode: 1 });
    const lost = advertisedAtoms(
      [{ allocationId: 'alloc_2', stableIds: ['GPU-gone', 'GPU-0-slot-1'] }],
      gpus,
    );
    expect(lost.get('gpu')).toEqual([expect.objectContaining({ id: 'GPU-gone', health: 'Unhealthy' })]);
    expect(lost.get('slot')).toEqual([
      expect.objectContaining({
        id: 'GPU-0-slot-1',
        visibleDevice: 'GPU-0',
        cdiDevice: 'bcd.dev/gpu=GPU-0-slot-1',
      }),
    ]);
  });

  it('puts a pod on the smallest NVLink domain that holds it', () => {
    const two = preferredAllocation(atoms, ids, [], 2);
    expect(new Set(two.map(domainOf))).toEqual(new Set(['b']));
    const three = preferredAllocation(atoms, ids, [], 3);
    expect(new Set(three.map(domainOf))).toEqual(new Set(['a']));
  });

  it('completes the must-include ids from their own domain when it can', () => {
    const pinned = preferredAllocation(atoms, [...ids].reverse(), ['GPU-2'], 3);
    expect(pinned[0]).toBe('GPU-2');
    expect(new Set(pinned.map(domainOf))).toEqual(new Set(['a']));
  });

  it('spans as few domains as it must when none fits, and never prefers an id it does not advertise', () => {
    const five = preferredAllocation(atoms, ids, [], 5);
    expect(five).toHaveLength(5);
    expect(five.filter((id) => domainOf(id) === 'a')).toHaveLength(4);
    expect(preferredAllocation(atoms, ['GPU-x', 'GPU-4'], ['GPU-y'], 2)).toEqual(['GPU-4']);
  });
});
