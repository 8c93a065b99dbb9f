import type { Logger } from '../core/logger.ts';
import { type CgroupDriver, cgroupsWritable, createCgroupDriver } from './cgroups.ts';

/**
 * `bcd node`'s slices: the machine's own hierarchy (v2, systemd's v2, or v1), under `bcd`. Where
 * cgroups cannot be written the agent runs without, and advertises no `devices.limits`, so the
 * control plane never places a hold with host resources on it.
 */
export function nodeCgroups(log: Logger, mount = '/sys/fs/cgroup'): CgroupDriver | null {
  const writable = cgroupsWritable(mount);
  if (!writable.ok) {
    log.warn({ reason: writable.reason }, 'host resources are not enforced: no devices.limits');
    return null;
  }
  log.info({ flavor: writable.flavor }, 'holds get cgroup slices');
  return createCgroupDriver({ mount, flavor: writable.flavor, root: 'bcd' });
}
