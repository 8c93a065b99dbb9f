import { sql } from 'kysely';
import type { Db } from '../../core/database.ts';
import { endedAllocationStates } from '../../domain/fleet.ts';
import type { HostPublicationRow } from '../../domain/holds-publication.ts';
import { bookingOfDevice } from '../allocations/bookings.ts';
import { literalList } from '../sql-literals.ts';

/** Live holds, in SQL: not released, heartbeat + TTL ahead of compute_now(). */
export const liveHold = (alias: string) =>
  sql.raw(
    `${alias}.released_at IS NULL AND ${alias}.heartbeat_at + make_interval(secs => ${alias}.ttl_seconds) > compute_now()`,
  );

/**
 * What each node of `ids` publishes, read at compute_now(): its scheduling state and NoSchedule
 * conditions, the allocatable vCPU and memory, what live reservations book of them now, the VRAM
 * of its healthy GPUs and of those free now, and what its live holds take. Read-only; in a
 * transaction that locked the node's resource rows it is exact for that transaction.
 */
export async function readHostPublicationRows(db: Db, ids: readonly string[]): Promise<HostPublicationRow[]> {
  if (ids.length === 0) return [];
  const ended = literalList(endedAllocationStates);
  const { rows } = await sql<HostPublicationRow>`
    SELECT n.id, n.name, n.pool_id, n.provision_state, n.cordoned, n.cordon_reason, n.draining, n.maintenance,
           n.maintenance_reason, n.connectivity, n.observed_generation, n.last_heartbeat_at, compute_now() AS now,
           (SELECT h.allocatable FROM host_resources h WHERE h.node_id = n.id AND h.resource = 'vcpu') AS cpu_total,
           (SELECT h.allocatable FROM host_resources h WHERE h.node_id = n.id AND h.resource = 'memoryGiB') AS ram_total,
           (SELECT COALESCE(sum(sb.amount), 0) FROM scalar_bookings sb JOIN allocations a ON a.id = sb.allocation_id
             WHERE sb.node_id = n.id AND sb.resource = 'vcpu' AND sb.during @> compute_now()
               AND a.state NOT IN (${ended})) AS cpu_booked,
           (SELECT COALESCE(sum(sb.amount), 0) FROM scalar_bookings sb JOIN allocations a ON a.id = sb.allocation_id
             WHERE sb.node_id = n.id AND sb.resource = 'memoryGiB' AND sb.during @> compute_now()
               AND a.state NOT IN (${ended})) AS ram_booked,
           (SELECT count(DISTINCT a.id) FROM allocations a JOIN scalar_bookings sb ON sb.allocation_id = a.id
             WHERE a.node_id = n.id AND sb.during @> compute_now() AND a.state NOT IN (${ended})) AS reservations,
           (SELECT sum((d.attributes->>'memoryMiB')::numeric) / 1024 FROM devices d
             WHERE d.node_id = n.id AND d.class = 'gpu' AND d.removed_at IS NULL AND d.health = 'healthy') AS vram_total,
           (SELECT COALESCE(sum((d.attributes->>'memoryMiB')::numeric) / 1024, 0) FROM devices d
             WHERE d.node_id = n.id AND d.class = 'gpu' AND d.removed_at IS NULL AND d.health = 'healthy'
               AND NOT EXISTS (SELECT 1 FROM device_bookings b JOIN allocations a ON a.id = b.allocation_id
                               WHERE ${bookingOfDevice('b', sql.ref('d.id'))} AND a.state NOT IN (${ended}) AND b.during @> compute_now())) AS vram_free,
           (SELECT count(*) FROM host_holds hh WHERE hh.node_id = n.id AND ${liveHold('hh')}) AS holds,
           (SELECT COALESCE(sum(hh.cpu_cores), 0) FROM host_holds hh WHERE hh.node_id = n.id AND ${liveHold('hh')}) AS held_cpu,
           (SELECT COALESCE(sum(hh.ram_gib), 0) FROM host_holds hh WHERE hh.node_id = n.id AND ${liveHold('hh')}) AS held_ram,
           (SELECT COALESCE(sum(hh.vram_gib), 0) FROM host_holds hh WHERE hh.node_id = n.id AND ${liveHold('hh')}) AS held_vram,
           COALESCE((SELECT json_agg(json_build_object('type', c.type, 'reason', c.reason) ORDER BY c.type)
                     FROM node_conditions c WHERE c.node_id = n.id AND c.effect = 'NoSchedule'), '[]') AS conditions
    FROM nodes n WHERE n.id = ANY(${ids as string[]}::text[])`.execute(db);
  const byId = new Map(rows.map((r) => [r.id, r]));
  return ids.flatMap((id) => (byId.has(id) ? [byId.get(id)!] : []));
}
