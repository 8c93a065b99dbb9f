import { readdirSync, readFileSync } from 'node:fs';
import path from 'node:path';
import { cpulistBounds, formatCpulist, parseCpulist } from '../domain/host-limits.ts';
import type { HostSection } from '../domain/inventory-sections.ts';

/**
 * A real host's NUMA layout from sysfs (under `sysRoot`, `/` on a host, a fixture tree in tests):
 * each node's CPUs (`/sys/devices/system/node/node<N>/cpulist`) and memory (`meminfo`), the
 * isolated CPUs (`/sys/devices/system/cpu/isolated`), and the NUMA node of a GPU's PCI device
 * (`/sys/bus/pci/devices/<bus id>/numa_node`). Files are read within bounds; one that is missing
 * or malformed leaves its part out rather than failing the inventory.
 */

/** At most this much of any sysfs file is read. */
const maxFileBytes = cpulistBounds.maxChars;
const maxNumaNodes = 1024;

function readSmall(file: string): string | null {
  try {
    const text = readFileSync(file, 'utf8');
    return text.length > maxFileBytes ? null : text.trim();
  } catch {
    return null;
  }
}

/** `00000000:18:00.0` (nvidia-smi: 8-digit domain, upper case) → `0000:18:00.0` (sysfs); null if not a bus id. */
export function sysfsPciAddress(busId: string): string | null {
  const match = /^([0-9a-fA-F]{4,8}):([0-9a-fA-F]{2}):([0-9a-fA-F]{2})\.([0-7])$/.exec(busId.trim());
  if (!match) return null;
  return `${match[1]!.slice(-4)}:${match[2]}:${match[3]}.${match[4]}`.toLowerCase();
}

/** The NUMA nodes of the host with their CPUs and memory, by node number; empty without sysfs. */
export function readNumaNodes(sysRoot: string): NonNullable<HostSection['numa']> {
  const base = path.join(sysRoot, 'sys/devices/system/node');
  let entries: string[];
  try {
    entries = readdirSync(base);
  } catch {
    return [];
  }
  const nodes: NonNullable<HostSection['numa']> = [];
  for (const entry of entries) {
    const match = /^node(\d{1,4})$/.exec(entry);
    if (!match || Number(match[1]) >= maxNumaNodes) continue;
    const cpus = parseCpulist(readSmall(path.join(base, entry, 'cpulist')) ?? '');
    // A node without CPUs (memory only, e.g. CXL or HBM) carries no cpuset.
    if (cpus.length === 0) continue;
    const meminfo = readSmall(path.join(base, entry, 'meminfo')) ?? '';
    const kb = Number(/^Node\s+\d+\s+MemTotal:\s+(\d{1,15})\s+kB$/m.exec(meminfo)?.[1] ?? 0);
    nodes.push({ node: Number(match[1]), cpus: formatCpulist(cpus), memoryGiB: Math.floor(kb / 1024 ** 2) });
  }
  return nodes.sort((a, b) => a.node - b.node);
}

/** The CPUs the kernel isolated (`isolcpus`), as a cpulist; null when none or unreadable. */
export function readIsolatedCpus(sysRoot: string): string | null {
  const cpus = parseCpulist(readSmall(path.join(sysRoot, 'sys/devices/system/cpu/isolated')) ?? '');
  return cpus.length > 0 ? formatCpulist(cpus) : null;
}

/**
 * The NUMA node of the PCI device at `busId`, or -1 when unknown. The kernel says -1 on a host
 * without NUMA: there, the only node (when sysfs shows exactly one) is the device's.
 */
export function readPciNumaNode(
  sysRoot: string,
  busId: string,
  numaNodes: readonly { node: number }[],
): number {
  const address = sysfsPciAddress(busId);
  if (!address) return -1;
  const text = readSmall(path.join(sysRoot, 'sys/bus/pci/devices', address, 'numa_node'));
  const value = text !== null && /^-?\d{1,4}$/.test(text) ? Number(text) : Number.NaN;
  if (Number.isInteger(value) && value >= 0 && value < maxNumaNodes) return value;
  return numaNodes.length === 1 ? numaNodes[0]!.node : -1;
}
