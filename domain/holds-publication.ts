import { exhaustionOf, type HostPublication } from './holds.ts';

/** A node's scheduling state, as the capacity views read it. */
export interface NodeSchedulingState {
  provision_state: string;
  cordoned: boolean;
  cordon_reason: string | null;
  draining: boolean;
  maintenance: boolean;
  maintenance_reason: string | null;
  connectivity: string;
  observed_generation: string | number | null;
}

/** What db/holds/publication.ts reads for one node (numerics as pg answers them). */
export interface HostPublicationRow extends NodeSchedulingState {
  id: string;
  name: string;
  pool_id: string | null;
  last_heartbeat_at: Date | null;
  now: Date;
  cpu_total: string | null;
  ram_total: string | null;
  cpu_booked: string;
  ram_booked: string;
  reservations: string;
  vram_total: string | null;
  vram_free: string;
  holds: string;
  held_cpu: string;
  held_ram: string;
  held_vram: string;
  conditions: Array<{ type: string; reason: string }>;
}

const num = (v: string | number | null | undefined) => (v === null || v === undefined ? null : Number(v));

/**
 * Why a node's scheduling state takes no new work (empty when it does): provisioning, draining or
 * cordoned, maintenance, connectivity, a desired state not applied yet, NoSchedule conditions.
 */
export function schedulingRefusals(
  n: NodeSchedulingState,
  conditions: ReadonlyArray<{ type: string; reason: string }>,
): string[] {
  const out: string[] = [];
  if (n.provision_state !== 'ready') out.push(`provisioning: ${n.provision_state}`);
  if (n.draining) out.push('draining');
  else if (n.cordoned) out.push(`cordoned${n.cordon_reason ? ` (${n.cordon_reason})` : ''}`);
  if (n.maintenance) out.push(`maintenance${n.maintenance_reason ? ` (${n.maintenance_reason})` : ''}`);
  if (n.connectivity !== 'connected')
    out.push(n.connectivity === 'unreachable' ? 'unreachable' : 'connectivity unknown');
  else if (num(n.observed_generation) === null || num(n.observed_generation)! < 1)
    out.push('desired state not applied yet');
  for (const c of conditions) {
    if (!out.some((r) => r.startsWith(c.type.toLowerCase()))) out.push(`${c.type}: ${c.reason}`);
  }
  return out;
}

const minus = (a: number | null, b: number) => (a === null ? null : Math.round((a - b) * 1000) / 1000);

/**
 * A node's publication from its row: measured figures are what reservations leave now, available
 * ones are net of every live hold too; below one core or one GiB it is `reservations_exhausted`.
 * A node whose session is not connected has no fresh publication (holds are then taken on trust),
 * and a figure never reported stays null. Pure.
 */
export function publicationOf(row: HostPublicationRow): HostPublication {
  const total = { cpuCores: num(row.cpu_total), ramGiB: num(row.ram_total), vramGiB: num(row.vram_total) };
  const measured = {
    cpuCores: minus(total.cpuCores, Number(row.cpu_booked)),
    ramGiB: minus(total.ramGiB, Number(row.ram_booked)),
    vramGiB: total.vramGiB === null ? null : Number(row.vram_free),
  };
  const reserved = {
    cpuCores: Number(row.held_cpu),
    ramGiB: Number(row.held_ram),
    vramGiB: Number(row.held_vram),
  };
  const available = {
    cpuCores: minus(measured.cpuCores, reserved.cpuCores),
    ramGiB: minus(measured.ramGiB, reserved.ramGiB),
    vramGiB: minus(measured.vramGiB, reserved.vramGiB),
  };
  const refusals = schedulingRefusals(row, row.conditions);
  const exhausted = exhaustionOf(available);
  return {
    nodeId: row.id,
    name: row.name,
    poolId: row.pool_id,
    fresh: row.connectivity === 'connected',
    schedulingRefusals: refusals,
    total,
    measured,
    available,
    reserved,
    runningWorkloads: Number(row.holds),
    runningReservations: Number(row.reservations),
    acceptingJobs: refusals.length === 0 && exhausted === null,
    admissionReason: refusals[0] ?? exhausted,
    publishedAt: row.last_heartbeat_at?.getTime() ?? null,
    ageSeconds: row.last_heartbeat_at
      ? Math.max(0, Math.round((row.now.getTime() - row.last_heartbeat_at.getTime()) / 1000))
      : null,
  };
}
