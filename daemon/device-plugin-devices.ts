import type { GpuInventory } from '../domain/inventory-sections.ts';
import { visibleDeviceOf } from './devices.ts';

/**
 * What bcd's device plugin advertises to the kubelet: exactly the atoms booked to its live
 * `kubernetes`-bound holds, each under the resource name of its kind (whole GPUs `bcd.dev/gpu`,
 * MIG instances `bcd.dev/gpu.mig`, time-slice and MPS slots `bcd.dev/gpu.slot`), healthy or not.
 */
export const kubernetesResourceNames = {
  gpu: 'bcd.dev/gpu',
  mig: 'bcd.dev/gpu.mig',
  slot: 'bcd.dev/gpu.slot',
} as const;
export type KubernetesResourceKind = keyof typeof kubernetesResourceNames;
export const kubernetesResourceKinds = Object.keys(kubernetesResourceNames) as KubernetesResourceKind[];

/** The socket a resource kind is served on, relative to the device-plugin directory. */
export function pluginSocketName(kind: KubernetesResourceKind): string {
  return kind === 'gpu' ? 'bcd-gpu.sock' : `bcd-gpu-${kind}.sock`;
}

/** A `kubernetes`-bound hold as the plugin needs it. */
export interface KubernetesHold {
  allocationId: string;
  /** The booked atoms' stable ids: GPU UUIDs, MIG UUIDs or `<GPU UUID>-slot-<n>`. */
  stableIds: readonly string[];
}

export interface AdvertisedAtom {
  /** The device id the kubelet sees: the atom's stable id. */
  id: string;
  kind: KubernetesResourceKind;
  allocationId: string;
  health: 'Healthy' | 'Unhealthy';
  /** The GPU the workload sees (a slot's GPU, else the atom itself). */
  visibleDevice: string;
  cdiDevice: string;
  numaNode: number | null;
  nvlinkDomain: string | null;
}

const slotSuffix = /-slot-\d{1,2}$/;

export function resourceKindOf(stableId: string): KubernetesResourceKind {
  if (stableId.startsWith('MIG-')) return 'mig';
  return slotSuffix.test(stableId) ? 'slot' : 'gpu';
}

/**
 * The atoms to advertise, by resource kind, sorted by id. An atom whose GPU the driver no longer
 * lists is still advertised (as Unhealthy): it stays booked to the tenant until the booking ends.
 */
export function advertisedAtoms(
  holds: readonly KubernetesHold[],
  gpus: readonly GpuInventory[],
): Map<KubernetesResourceKind, AdvertisedAtom[]> {
  const byUuid = new Map(gpus.map((g) => [g.uuid, g]));
  const migParent = new Map(gpus.flatMap((g) => (g.mig?.instances ?? []).map((m) => [m.uuid, g] as const)));
  const out = new Map<KubernetesResourceKind, AdvertisedAtom[]>(kubernetesResourceKinds.map((k) => [k, []]));
  for (const hold of holds) {
    for (const id of hold.stableIds) {
      const kind = resourceKindOf(id);
      const gpu = kind === 'mig' ? migParent.get(id) : byUuid.get(visibleDeviceOf(id));
      out.get(kind)!.push({
        id,
        kind,
        allocationId: hold.allocationId,
        health: gpu?.health === 'healthy' ? 'Healthy' : 'Unhealthy',
        visibleDevice: visibleDeviceOf(id),
        cdiDevice: `bcd.dev/gpu=${id}`,
        numaNode: gpu && gpu.numaNode >= 0 ? gpu.numaNode : null,
        nvlinkDomain: gpu?.nvlinkDomain ?? null,
      });
    }
  }
  for (const list of out.values()) list.sort((a, b) => a.id.localeCompare(b.id));
  return out;
}

/**
 * GetPreferredAllocation for one container: `size` ids out of `available` including every one of
 * `mustInclude`, all on one NVLink domain when any domain can hold them (the domain of the
 * must-include ids first, then the domain with the fewest free atoms that still fits, so large
 * domains stay whole for larger pods), and on as few domains as possible otherwise. Ids it does not
 * know are never preferred. Answers fewer than `size` ids only when fewer are available.
 */
export function preferredAllocation(
  atoms: readonly AdvertisedAtom[],
  available: readonly string[],
  mustInclude: readonly string[],
  size: number,
): string[] {
  const known = new Map(atoms.map((a) => [a.id, a]));
  const chosen = [...new Set(mustInclude)].filter((id) => known.has(id));
  const free = [...new Set(available)].filter((id) => known.has(id) && !chosen.includes(id)).sort();
  const domainOf = (id: string) => known.get(id)!.nvlinkDomain ?? `atom:${id}`;
  const byDomain = new Map<string, string[]>();
  for (const id of free) byDomain.set(domainOf(id), [...(byDomain.get(domainOf(id)) ?? []), id]);
  const need = () => size - chosen.length;
  const pinned = new Set(chosen.map(domainOf));
  // The must-include ids' domain first, if it alone can finish the pod.
  if (pinned.size === 1) {
    const same = byDomain.get([...pinned][0]!) ?? [];
    if (same.length >= need()) return [...chosen, ...same.slice(0, Math.max(0, need()))];
  }
  if (pinned.size === 0) {
    const fitting = [...byDomain.entries()]
      .filter(([, ids]) => ids.length >= need())
      .sort(([a, x], [b, y]) => x.length - y.length || a.localeCompare(b));
    if (fitting[0]) return [...chosen, ...fitting[0][1].slice(0, Math.max(0, need()))];
  }
  // No single domain fits: the fullest domains first (fewest domains spanned).
  const domains = [...byDomain.entries()].sort(
    ([a, x], [b, y]) =>
      Number(pinned.has(b)) - Number(pinned.has(a)) || y.length - x.length || a.localeCompare(b),
  );
  for (const [, ids] of domains) {
    for (const id of ids) if (need() > 0) chosen.push(id);
  }
  return chosen;
}
