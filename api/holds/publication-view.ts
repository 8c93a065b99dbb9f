import { z } from 'zod';
import type { Db } from '../../core/database.ts';
import { listHolds } from '../../db/holds/holds.ts';
import { readHostPublicationRows } from '../../db/holds/publication.ts';
import { holdViewSchema } from '../../domain/holds.ts';
import { publicationOf } from '../../domain/holds-publication.ts';

const figures = z.object({
  availableCpuCores: z.number().nullable(),
  freeRamGiB: z.number().nullable(),
  freeVramGiB: z.number().nullable(),
});

/**
 * What a node publishes, net of every live hold and reservation, as `capacity.nodes` and
 * `nodes.get` carry it. A figure never reported is null (`not reported`), never zero.
 */
export const hostPublicationShape = {
  /** False below one core or one GiB net (`reservations_exhausted`) or when its state takes no work. */
  acceptingJobs: z.boolean(),
  admissionReason: z.string().nullable(),
  /** CPU cores, RAM and VRAM GiB free now net of every live hold and reservation. */
  ...figures.shape,
  /** What the reservations' bookings leave now, before holds. */
  measured: figures,
  /** Live holds on the node (all tenants'). */
  runningWorkloads: z.number(),
  /** What the live holds take. */
  reserved: z.object({ cpuCores: z.number(), ramGiB: z.number(), vramGiB: z.number() }),
  /** The holds the caller may see on the node: its own, or every one on a pool it owns. */
  holds: z.array(holdViewSchema),
  /** Seconds since the node last published (its last heartbeat). */
  publicationAgeSeconds: z.number().nullable(),
};

export type HostPublicationFields = z.infer<z.ZodObject<typeof hostPublicationShape>>;

/** The publication fields of each node of `ids`, with the holds `tenantId` may see. Read-only. */
export async function readHostPublicationViews(
  db: Db,
  ids: readonly string[],
  tenantId: string | null,
): Promise<Map<string, HostPublicationFields>> {
  const [rows, holds] = await Promise.all([
    readHostPublicationRows(db, ids),
    tenantId && ids.length > 0 ? listHolds(db, { tenantId, nodeIds: ids, includeEnded: false }) : [],
  ]);
  return new Map(
    rows.map((row) => {
      const p = publicationOf(row);
      return [
        row.id,
        {
          acceptingJobs: p.acceptingJobs,
          admissionReason: p.admissionReason,
          availableCpuCores: p.available.cpuCores,
          freeRamGiB: p.available.ramGiB,
          freeVramGiB: p.available.vramGiB,
          measured: {
            availableCpuCores: p.measured.cpuCores,
            freeRamGiB: p.measured.ramGiB,
            freeVramGiB: p.measured.vramGiB,
          },
          runningWorkloads: p.runningWorkloads,
          reserved: p.reserved,
          holds: holds.filter((h) => h.nodeId === row.id),
          publicationAgeSeconds: p.ageSeconds,
        },
      ];
    }),
  );
}

const unpublished: HostPublicationFields = {
  acceptingJobs: false,
  admissionReason: 'not published',
  availableCpuCores: null,
  freeRamGiB: null,
  freeVramGiB: null,
  measured: { availableCpuCores: null, freeRamGiB: null, freeVramGiB: null },
  runningWorkloads: 0,
  reserved: { cpuCores: 0, ramGiB: 0, vramGiB: 0 },
  holds: [],
  publicationAgeSeconds: null,
};

/** The node's publication fields from `readHostPublicationViews` (a node read since: unpublished). */
export const publicationFieldsOf = (views: Map<string, HostPublicationFields>, nodeId: string) =>
  views.get(nodeId) ?? unpublished;

/** What the node's live holds take of a host resource (`vcpu`, `memoryGiB`). */
export function heldOf(views: Map<string, HostPublicationFields>, nodeId: string, resource: string): number {
  const reserved = views.get(nodeId)?.reserved;
  if (!reserved) return 0;
  return resource === 'vcpu' ? reserved.cpuCores : resource === 'memoryGiB' ? reserved.ramGiB : 0;
}
