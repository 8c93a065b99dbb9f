import { existsSync, readFileSync } from 'node:fs';
import path from 'node:path';
import { describe, expect, it } from 'vitest';
import { convergeDevices, writeHold } from '../../daemon/devices.ts';
import { useTempDir } from '../support/temp-dir.ts';

const root = useTempDir('bcd-devices-');
const roots = { cdiDir: path.join(root, 'etc/cdi'), envDir: path.join(root, 'run/bcd/allocations') };

const assignment = (allocationId: string, stableIds: string[], limits?: Record<string, number>) => ({
  allocationId,
  deviceIds: stableIds.map((_, i) => `dev_${i}`),
  stableIds,
  until: 1_800_000_000_000,
  binding: 'hold' as const,
  ...(limits ? { limits } : {}),
});

describe('the devices converger', () => {
  it('writes a CDI spec and env file naming exactly the assigned GPUs, and removes unassigned holds', () => {
    const a = assignment('alloc_a', ['GPU-1', 'GPU-2']);
    const b = assignment('alloc_b', ['GPU-3'], { cpuMillis: 8000, memoryBytes: 64 * 2 ** 30 });
    const first = convergeDevices(roots, [a, b]);
    expect(first.released).toEqual([]);
    const cdi = JSON.parse(readFileSync(path.join(roots.cdiDir, 'bcd-alloc_a.json'), 'utf8'));
    expect(cdi.kind).toBe('bcd.dev/gpu');
    expect(cdi.devices.map((d: { name: string }) => d.name)).toEqual(['GPU-1', 'GPU-2']);
    const env = readFileSync(path.join(roots.envDir, 'alloc_a.env'), 'utf8');
    expect(env).toContain('NVIDIA_VISIBLE_DEVICES=GPU-1,GPU-2');
    expect(env).toContain('BCD_CDI_DEVICES=bcd.dev/gpu=GPU-1,bcd.dev/gpu=GPU-2');
    expect(env).not.toContain('BCD_CGROUP_PARENT');
    const limited = first.held.find((h) => h.allocationId === 'alloc_b')!;
    expect(limited.cgroupParent).toBe('bcd-alloc-alloc_b.slice');
    expect(readFileSync(limited.envFile, 'utf8')).toContain('BCD_CPU_MILLIS=8000');

    const second = convergeDevices(roots, [b]);
    expect(second.released).toEqual(['alloc_a']);
    expect(existsSync(path.join(roots.cdiDir, 'bcd-alloc_a.json'))).toBe(false);
    expect(existsSync(path.join(roots.envDir, 'alloc_a.env'))).toBe(false);
  });

  it('refuses ids that could escape its directories', () => {
    expect(() => writeHold(roots, assignment('../../etc/passwd', ['GPU-1']))).toThrow(/unsafe/);
    expect(() => writeHold(roots, assignment('alloc_c', ['GPU-1/../../x']))).toThrow(/unsafe/);
  });
});
