import { sql, type Transaction } from 'kysely';
import type { Database } from '../../core/database.ts';
import { type AssignmentLimits, assignmentLimits, hostReserveVcpu } from '../../domain/host-limits.ts';
import { hostSectionSchema } from '../../domain/inventory-sections.ts';
import type { DeviceAssignment } from '../../domain/node-spec.ts';
import { defaultMpsThreadPercentage, poolReplicas } from '../../domain/sharing.ts';

type Trx = Transaction<Database>;

/**
 * What the node must enforce for each allocation beside its devices: the limits from its scalar
 * bookings (vCPU, memory, 1 GiB huge pages) with a cpuset on its devices' NUMA nodes, cut from the
 * node's latest host inventory without the pool's reserved CPUs; and, in a time-slice or MPS pool,
 * the sharing settings the workload gets. Read-only; allocations without either are left out.
 */
export async function holdTermsOf(
  trx: Trx,
  allocationIds: readonly string[],
): Promise<Map<string, Pick<DeviceAssignment, 'limits' | 'sharing'>>> {
  const out = new Map<string, Pick<DeviceAssignment, 'limits' | 'sharing'>>();
  if (allocationIds.length === 0) return out;
  const { rows } = await sql<{
    id: string;
    sharing_mode: string;
    policy: Record<string, unknown> | null;
    scalars: Record<string, string> | null;
    numa_nodes: number[] | null;
    host: unknown;
  }>`
    SELECT a.id, p.sharing_mode, p.policy,
      (SELECT json_object_agg(s.resource, s.amount) FROM scalar_bookings s WHERE s.allocation_id = a.id) AS scalars,
      (SELECT array_agg(DISTINCT (d.attributes->>'numaNode')::int) FROM device_bookings b
         JOIN devices d ON d.id = b.device_id WHERE b.allocation_id = a.id AND d.attributes ? 'numaNode') AS numa_nodes,
      (SELECT i.data FROM inventory_snapshots i WHERE i.node_id = a.node_id AND i.section = 'host'
         ORDER BY i.id DESC LIMIT 1) AS host
    FROM allocations a JOIN nodes n ON n.id = a.node_id JOIN pools p ON p.id = n.pool_id
    WHERE a.id = ANY(${[...allocationIds]}::text[])`.execute(trx);
  for (const row of rows) {
    const policy = row.policy ?? {};
    const scalars = row.scalars ?? {};
    const host = hostSectionSchema.safeParse(row.host);
    const limits: AssignmentLimits | undefined = assignmentLimits({
      booked: {
        vcpu: Number(scalars.vcpu ?? 0),
        memoryGiB: Number(scalars.memoryGiB ?? 0),
        hugepages1Gi: Number(scalars.hugepages1Gi ?? 0),
      },
      deviceNumaNodes: row.numa_nodes ?? [],
      numa: host.success ? (host.data.numa ?? []) : [],
      ...(host.success && host.data.isolatedCpus ? { isolatedCpus: host.data.isolatedCpus } : {}),
      reserveVcpu: hostReserveVcpu(policy),
    });
    const mode = row.sharing_mode;
    const sharing: DeviceAssignment['sharing'] =
      mode === 'time-slice' || mode === 'mps'
        ? {
            mode,
            replicas: poolReplicas(mode, policy),
            ...(mode === 'mps'
              ? {
                  mpsThreadPercentage:
                    Number(
                      (policy.sharing as { mpsThreadPercentage?: number } | undefined)?.mpsThreadPercentage,
                    ) || defaultMpsThreadPercentage(poolReplicas(mode, policy)),
                }
              : {}),
          }
        : undefined;
    if (limits || sharing)
      out.set(row.id, { ...(limits ? { limits } : {}), ...(sharing ? { sharing } : {}) });
  }
  return out;
}
