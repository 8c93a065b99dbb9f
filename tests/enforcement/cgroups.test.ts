import { spawn } from 'node:child_process';
import { once } from 'node:events';
import { rmdirSync } from 'node:fs';
import path from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import {
  cgroupsWritable,
  createCgroupDriver,
  sliceName,
  systemdSlicePath,
  systemdSliceUnit,
} from '../../daemon/cgroups.ts';

/**
 * The kernel enforces what bcd writes: these tests create real slices under a sub-tree of this
 * machine's cgroupfs (v1 or v2, whichever it has). They need root; elsewhere they are skipped and
 * say why. CI runs as root.
 */
const writable = cgroupsWritable();
const skipReason = writable.ok ? '' : `cgroups cannot be written here: ${writable.reason}`;
const root = `bcd-test-${process.pid}`;

describe.skipIf(!writable.ok)(
  `host resources on the kernel's cgroups${skipReason ? ` (skipped: ${skipReason})` : ''}`,
  () => {
    const driver = createCgroupDriver({ root })!;
    afterAll(() => {
      for (const dir of Object.values(driver.directories(sliceName('alloc_x')))) {
        try {
          rmdirSync(path.dirname(dir));
        } catch {
          // already gone
        }
      }
    });

    it('reads back the booked cpu quota, memory limit and cpuset from cgroupfs', () => {
      const slice = sliceName(`alloc_readback${process.pid}`);
      driver.apply(slice, { cpuMillis: 1500, memoryBytes: 256 * 1024 ** 2, cpus: '0', mems: '0' });
      try {
        const back = driver.readBack(slice);
        expect(back.memoryBytes).toBe(256 * 1024 ** 2);
        expect(back.cpuQuotaUs).toBe(150_000);
        expect(back.cpuPeriodUs).toBe(100_000);
        expect(back.cpus).toBe('0');
        expect(back.mems).toBe('0');
        expect(driver.list()).toContain(slice);
      } finally {
        expect(driver.remove(slice)).toBe('removed');
      }
      expect(driver.exists(slice)).toBe(false);
    });

    it('the kernel OOM-kills a process in the slice that allocates past its memory limit', async () => {
      const slice = sliceName(`alloc_oom${process.pid}`);
      driver.apply(slice, { memoryBytes: 64 * 1024 ** 2 });
      try {
        // The child waits for a line on stdin, so it is inside the slice before it allocates.
        const child = spawn(
          process.execPath,
          [
            '-e',
            "process.stdin.once('data', () => { const a = []; for (let i = 0; i < 64; i++) a.push(Buffer.alloc(16 << 20, 1)); console.log('survived'); process.exit(0); });",
          ],
          { stdio: ['pipe', 'pipe', 'inherit'] },
        );
        let out = '';
        child.stdout.on('data', (d) => {
          out += d;
        });
        driver.addProcess(slice, child.pid!);
        child.stdin.write('go\n');
        const [code, signal] = (await once(child, 'exit')) as [number | null, string | null];
        expect(out).not.toContain('survived');
        expect(signal).toBe('SIGKILL');
        expect(code).toBeNull();
        // The slice empties once the process is gone; then it can be removed.
      } finally {
        await expect.poll(() => driver.remove(slice), { timeout: 30_000 }).toBe('removed');
      }
    });

    it('a slice with a process in it is busy and kept until it is empty', async () => {
      const slice = sliceName(`alloc_busy${process.pid}`);
      driver.apply(slice, { cpuMillis: 500 });
      const child = spawn(process.execPath, ['-e', 'setTimeout(() => {}, 60000)'], { stdio: 'ignore' });
      try {
        driver.addProcess(slice, child.pid!);
        expect(driver.remove(slice)).toBe('busy');
        expect(driver.exists(slice)).toBe(true);
      } finally {
        child.kill('SIGKILL');
        await once(child, 'exit');
      }
      await expect.poll(() => driver.remove(slice), { timeout: 30_000 }).toBe('removed');
    });
  },
);

describe('systemd slices (rendering; systemd runs them)', () => {
  it('writes the hold limits as slice unit properties and nests the path the way systemd does', () => {
    const unit = systemdSliceUnit({ cpuMillis: 4000, memoryBytes: 8 * 1024 ** 3, cpus: '2-47', mems: '0' });
    expect(unit).toContain('CPUQuota=400%');
    expect(unit).toContain(`MemoryMax=${8 * 1024 ** 3}`);
    expect(unit).toContain('AllowedCPUs=2-47');
    expect(unit).toContain('AllowedMemoryNodes=0');
    expect(systemdSlicePath('bcd-alloc-alloc_01.slice')).toBe(
      'bcd.slice/bcd-alloc.slice/bcd-alloc-alloc_01.slice',
    );
  });
});
