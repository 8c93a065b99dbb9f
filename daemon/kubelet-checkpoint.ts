import { readFileSync, renameSync, writeFileSync } from 'node:fs';
import path from 'node:path';

/**
 * The kubelet's device manager checkpoint (`kubelet_internal_checkpoint` in the device-plugin
 * directory): every resource name a device plugin registered with its devices, and which pods'
 * containers hold which devices. bcd reads it to see whether something besides bcd can hand GPUs
 * to pods (ForeignGpuExposure) and which of its devices pods still hold.
 */
export const kubeletCheckpointName = 'kubelet_internal_checkpoint';

export interface KubeletCheckpoint {
  /** Resource name to the device ids its plugin registered. */
  registeredDevices: Record<string, string[]>;
  podDeviceEntries: Array<{
    podUid: string;
    containerName: string;
    resourceName: string;
    deviceIds: string[];
  }>;
}

/** The checkpoint, or null when there is none (or it cannot be read). */
export function readKubeletCheckpoint(dir: string): KubeletCheckpoint | null {
  let raw: unknown;
  try {
    raw = JSON.parse(readFileSync(path.join(dir, kubeletCheckpointName), 'utf8'));
  } catch {
    return null;
  }
  const data = (raw as { Data?: Record<string, unknown> })?.Data;
  if (!data || typeof data !== 'object') return null;
  const registered: Record<string, string[]> = {};
  const devices = data.RegisteredDevices;
  if (devices && typeof devices === 'object') {
    for (const [name, ids] of Object.entries(devices as Record<string, unknown>)) {
      registered[name] = Array.isArray(ids) ? ids.filter((id): id is string => typeof id === 'string') : [];
    }
  }
  const entries = Array.isArray(data.PodDeviceEntries) ? data.PodDeviceEntries : [];
  return {
    registeredDevices: registered,
    podDeviceEntries: entries.flatMap((e: Record<string, unknown>) => {
      if (!e || typeof e.ResourceName !== 'string') return [];
      // DeviceIDs is a list in old kubelets and a map of NUMA node to list since 1.20.
      const ids = Array.isArray(e.DeviceIDs)
        ? e.DeviceIDs
        : Object.values((e.DeviceIDs ?? {}) as Record<string, unknown>).flat();
      return [
        {
          podUid: String(e.PodUID ?? ''),
          containerName: String(e.ContainerName ?? ''),
          resourceName: e.ResourceName,
          deviceIds: ids.filter((id): id is string => typeof id === 'string'),
        },
      ];
    }),
  };
}

/** Writes a checkpoint in the kubelet's format (the kubelet stand-in does, as the kubelet would). */
export function writeKubeletCheckpoint(dir: string, checkpoint: KubeletCheckpoint): void {
  const body = {
    Data: {
      PodDeviceEntries: checkpoint.podDeviceEntries.map((e) => ({
        PodUID: e.podUid,
        ContainerName: e.containerName,
        ResourceName: e.resourceName,
        DeviceIDs: { '-1': e.deviceIds },
        AllocResp: '',
      })),
      RegisteredDevices: checkpoint.registeredDevices,
    },
    Checksum: 0,
  };
  const file = path.join(dir, kubeletCheckpointName);
  writeFileSync(`${file}.tmp`, JSON.stringify(body));
  renameSync(`${file}.tmp`, file);
}

/**
 * The resource names besides bcd's own through which the kubelet can hand GPUs to pods: another
 * device plugin registered for `nvidia.com/gpu` (or an NVIDIA MIG or shared kind), or any resource
 * whose devices are this node's GPU or MIG UUIDs. Sorted.
 */
export function foreignGpuResources(
  checkpoint: KubeletCheckpoint | null,
  gpuIds: ReadonlySet<string>,
): string[] {
  if (!checkpoint) return [];
  return Object.entries(checkpoint.registeredDevices)
    .filter(
      ([name, ids]) =>
        !name.startsWith('bcd.dev/') &&
        (/^nvidia\.com\/(gpu|mig-)/.test(name) || ids.some((id) => gpuIds.has(id.split('::')[0]!))),
    )
    .map(([name]) => name)
    .sort();
}
