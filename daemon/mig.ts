import { execFileSync } from 'node:child_process';
import type { GpuInventory, MigInstance } from '../domain/inventory-sections.ts';
import type { MigLayoutSettings } from '../domain/node-spec.ts';

/**
 * MIG on a real host, from nvidia-smi's own output: `nvidia-smi -q -x` says which GPUs are in MIG
 * mode and lists each MIG device's GPU and compute instance ids and memory; `nvidia-smi -L` names
 * each MIG device's profile and UUID (in the same per-GPU device order). Captured outputs of real
 * A100 and H100 machines are the fixtures under tests/fixtures/nvidia-smi/.
 */

function tag(xml: string, name: string): string | null {
  const match = new RegExp(`<${name}>([\\s\\S]*?)</${name}>`).exec(xml);
  return match ? match[1]!.trim() : null;
}

function blocks(xml: string, name: string): string[] {
  return [...xml.matchAll(new RegExp(`<${name}(?:\\s[^>]*)?>([\\s\\S]*?)</${name}>`, 'g'))].map((m) => m[1]!);
}

const mib = (text: string | null) => Number.parseInt(text ?? '0', 10) || 0;

/** `nvidia-smi -L`: per GPU UUID, its MIG devices in order with profile and UUID. */
export function parseMigList(list: string): Map<string, Array<{ profile: string; uuid: string }>> {
  const out = new Map<string, Array<{ profile: string; uuid: string }>>();
  let gpu: string | null = null;
  for (const line of list.split('\n')) {
    const g = /^GPU \d+: .*\(UUID: (GPU-[A-Za-z0-9-]+)\)/.exec(line);
    if (g) {
      gpu = g[1]!;
      out.set(gpu, []);
      continue;
    }
    const m = /^\s+MIG (\S+)\s+Device\s+(\d+): \(UUID: (MIG-[A-Za-z0-9/-]+)\)/.exec(line);
    if (m && gpu) out.get(gpu)!.push({ profile: m[1]!, uuid: m[3]! });
  }
  return out;
}

/**
 * Each GPU's MIG mode and instances from `nvidia-smi -q -x` and `nvidia-smi -L`, by GPU UUID; a GPU
 * without a `mig_mode` element (no MIG support) is left out.
 */
export function parseMigInventory(xml: string, list: string): Map<string, NonNullable<GpuInventory['mig']>> {
  const names = parseMigList(list);
  const out = new Map<string, NonNullable<GpuInventory['mig']>>();
  for (const gpu of blocks(xml, 'gpu')) {
    const uuid = tag(gpu, 'uuid');
    const mode = tag(tag(gpu, 'mig_mode') ?? '', 'current_mig');
    if (!uuid || !mode) continue;
    const enabled = mode.toLowerCase() === 'enabled';
    const listed = names.get(uuid) ?? [];
    const devices = blocks(tag(gpu, 'mig_devices') ?? '', 'mig_device');
    const instances: MigInstance[] = [];
    for (const device of devices) {
      const index = Number(tag(device, 'index'));
      const named = listed[index];
      if (!named) throw new Error(`nvidia-smi -L does not name MIG device ${index} of ${uuid}`);
      instances.push({
        uuid: named.uuid,
        profile: named.profile,
        gpuInstanceId: Number(tag(device, 'gpu_instance_id')),
        computeInstanceId: Number(tag(device, 'compute_instance_id')),
        memoryMiB: mib(tag(tag(device, 'fb_memory_usage') ?? '', 'total')),
      });
    }
    out.set(uuid, { mode: enabled ? 'enabled' : 'disabled', instances: enabled ? instances : [] });
  }
  return out;
}

/** Reads MIG state from the machine's nvidia-smi (empty when it has none). */
export function readMigInventory(run = execFileSync): Map<string, NonNullable<GpuInventory['mig']>> {
  try {
    const xml = run('nvidia-smi', ['-q', '-x'], { encoding: 'utf8', timeout: 60_000 }) as string;
    const list = run('nvidia-smi', ['-L'], { encoding: 'utf8', timeout: 60_000 }) as string;
    return parseMigInventory(xml, list);
  } catch {
    return new Map();
  }
}

/**
 * The nvidia-smi commands that put GPUs in MIG mode with exactly these instances: MIG mode on,
 * existing compute and GPU instances destroyed, then each profile created with its default compute
 * instance (`-cgi <profiles> -C`).
 */
export function migLayoutCommands(
  settings: MigLayoutSettings,
  indexOf: (uuid: string) => number,
): string[][] {
  const commands: string[][] = [];
  for (const gpu of settings.gpus) {
    const i = String(indexOf(gpu.uuid));
    commands.push(['-i', i, '-mig', '1']);
    commands.push(['mig', '-i', i, '-dci']);
    commands.push(['mig', '-i', i, '-dgi']);
    if (gpu.profiles.length > 0) commands.push(['mig', '-i', i, '-cgi', gpu.profiles.join(','), '-C']);
  }
  return commands;
}
