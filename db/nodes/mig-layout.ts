import { sql, type Transaction } from 'kysely';
import type { Database } from '../../core/database.ts';
import { ComputeError } from '../../domain/errors.ts';
import { endedAllocationStates } from '../../domain/fleet.ts';
import { canonicalJson, type MigLayoutSettings, migLayoutSettingsSchema } from '../../domain/node-spec.ts';
import { bookingOfDevice } from '../allocations/bookings.ts';
import { literalList } from '../sql-literals.ts';

type Trx = Transaction<Database>;

/**
 * Sets a node's `mig-layout` config unit in its NodeSpec `host` section (a new generation when it
 * changes; the same layout again changes nothing). bcd applies it, inventories the GPUs again, and
 * the instances it makes become bookable only once the node reports converging that generation.
 * CONFLICT naming the reservations when any GPU the layout changes has a live booking, on itself
 * or on one of its MIG instances (a layout change destroys them); INVALID_INPUT for a GPU the node
 * does not have; INVALID_STATE for a node outside a `mig` pool; NOT_FOUND for an unknown node.
 * GPUs not named keep their layout; naming none changes nothing. Takes the node's row lock.
 */
export async function setNodeMigLayout(
  trx: Trx,
  nodeId: string,
  layout: MigLayoutSettings,
): Promise<{ generation: number; changed: boolean }> {
  const settings = migLayoutSettingsSchema.parse(layout);
  const node = await trx
    .selectFrom('nodes as n')
    .leftJoin('pools as p', 'p.id', 'n.pool_id')
    .where('n.id', '=', nodeId)
    .select(['n.spec', 'n.spec_generation', 'n.pool_id', 'p.sharing_mode'])
    .forNoKeyUpdate('n')
    .executeTakeFirst();
  if (!node) throw new ComputeError('NOT_FOUND', `node ${nodeId} does not exist`);
  // Only a mig pool books instances: elsewhere a layout would leave its GPUs unbookable parents.
  if (settings.gpus.length > 0 && node.sharing_mode !== 'mig') {
    throw new ComputeError(
      'INVALID_STATE',
      `node ${nodeId} is in pool ${node.pool_id ?? '(none)'}, which shares its GPUs as ${node.sharing_mode ?? 'exclusive'}; MIG layouts apply to nodes of a mig pool`,
      { poolId: node.pool_id, sharingMode: node.sharing_mode ?? 'exclusive' },
    );
  }
  const uuids = settings.gpus.map((g) => g.uuid);
  const known = await trx
    .selectFrom('devices')
    .where('node_id', '=', nodeId)
    .where('class', '=', 'gpu')
    .where('removed_at', 'is', null)
    .where('stable_id', 'in', uuids.length > 0 ? uuids : [''])
    .select(['id', 'stable_id'])
    .execute();
  const missing = uuids.filter((u) => !known.some((k) => k.stable_id === u));
  if (missing.length > 0) {
    throw new ComputeError(
      'INVALID_INPUT',
      `gpus: node ${nodeId} has no GPU ${missing.join(', ')}; list its GPUs with nodes.get`,
    );
  }
  const spec = { ...((node.spec ?? {}) as Record<string, unknown>) };
  const host = { ...((spec.host ?? {}) as Record<string, unknown>) };
  const units = (Array.isArray(host.units) ? host.units : []) as Array<{ unit: string; settings: unknown }>;
  const current = units.find((u) => u.unit === 'mig-layout')?.settings as MigLayoutSettings | undefined;
  // Only GPUs whose profiles change are touched: their bookings would be destroyed.
  const changing = settings.gpus.filter(
    (g) =>
      canonicalJson(current?.gpus.find((c) => c.uuid === g.uuid)?.profiles ?? null) !==
      canonicalJson(g.profiles),
  );
  const parentIds = known.filter((k) => changing.some((g) => g.uuid === k.stable_id)).map((k) => k.id);
  if (parentIds.length > 0) {
    const { rows } = await sql<{ reservation_id: string }>`
      SELECT DISTINCT a.reservation_id FROM device_bookings b
      JOIN devices d ON ${bookingOfDevice('b', sql.ref('d.id'))}
      JOIN allocations a ON a.id = b.allocation_id
      WHERE (d.id = ANY(${parentIds}::text[]) OR d.parent_id = ANY(${parentIds}::text[]))
        AND a.state NOT IN (${literalList(endedAllocationStates)}) AND upper(b.during) > compute_now()
        AND a.reservation_id IS NOT NULL
      ORDER BY a.reservation_id`.execute(trx);
    if (rows.length > 0) {
      const ids = rows.map((r) => r.reservation_id);
      throw new ComputeError(
        'CONFLICT',
        `the MIG layout of node ${nodeId} cannot change while ${ids.join(', ')} book${ids.length === 1 ? 's' : ''} its instances; release ${ids.length === 1 ? 'it' : 'them'} or wait until ${ids.length === 1 ? 'it ends' : 'they end'}`,
        { reservationIds: ids },
      );
    }
  }
  if (changing.length === 0) return { generation: Number(node.spec_generation), changed: false };
  const merged: MigLayoutSettings = {
    gpus: [
      ...(current?.gpus ?? []).filter((c) => !settings.gpus.some((g) => g.uuid === c.uuid)),
      ...settings.gpus,
    ].sort((a, b) => a.uuid.localeCompare(b.uuid)),
  };
  const next = {
    ...spec,
    host: {
      ...host,
      units: [...units.filter((u) => u.unit !== 'mig-layout'), { unit: 'mig-layout', settings: merged }],
    },
  };
  if (canonicalJson(next) === canonicalJson(spec))
    return { generation: Number(node.spec_generation), changed: false };
  const row = await trx
    .updateTable('nodes')
    .set({
      spec: canonicalJson(next),
      spec_generation: sql<string>`spec_generation + 1`,
      updated_at: sql<Date>`compute_now()`,
    })
    .where('id', '=', nodeId)
    .returning('spec_generation')
    .executeTakeFirstOrThrow();
  return { generation: Number(row.spec_generation), changed: true };
}
