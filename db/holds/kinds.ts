import { sql, type Transaction } from 'kysely';
import type { Database, Db } from '../../core/database.ts';
import { ComputeError } from '../../domain/errors.ts';
import type { HoldKind } from '../../domain/holds.ts';

type Trx = Transaction<Database>;

interface HoldKindRow {
  pool_id: string;
  name: string;
  cpu_cores: string;
  ram_gib: string;
  vram_gib: string;
  ttl_seconds: number | null;
}

const kindOf = (r: HoldKindRow): HoldKind => ({
  poolId: r.pool_id,
  name: r.name,
  cpuCores: Number(r.cpu_cores),
  ramGiB: Number(r.ram_gib),
  vramGiB: Number(r.vram_gib),
  ttlSeconds: r.ttl_seconds,
});

/** The pool (by id or name) the tenant owns and has not archived; NOT_FOUND otherwise. */
export async function findOwnedPool(
  db: Db | Trx,
  tenantId: string,
  pool: string,
): Promise<{ id: string; name: string }> {
  const row = await db
    .selectFrom('pools')
    .select(['id', 'name'])
    .where('owner_tenant_id', '=', tenantId)
    .where('archived_at', 'is', null)
    .where((eb) => eb.or([eb('id', '=', pool), eb('name', '=', pool)]))
    .executeTakeFirst();
  if (!row)
    throw new ComputeError(
      'NOT_FOUND',
      `pool: tenant ${tenantId} owns no pool '${pool}'; see admin.listPools`,
    );
  return row;
}

/**
 * Declares (or redeclares) a workload kind of a pool: what one hold of it takes. Idempotent: the
 * same declaration twice leaves one row. Holds already taken keep the size they were taken with.
 */
export async function upsertHoldKind(
  db: Db,
  input: Omit<HoldKind, 'ttlSeconds'> & { ttlSeconds?: number | undefined },
): Promise<HoldKind> {
  const { rows } = await sql<HoldKindRow>`
    INSERT INTO hold_kinds (pool_id, name, cpu_cores, ram_gib, vram_gib, ttl_seconds)
    VALUES (${input.poolId}, ${input.name}, ${input.cpuCores}, ${input.ramGiB}, ${input.vramGiB}, ${input.ttlSeconds ?? null})
    ON CONFLICT (pool_id, name) DO UPDATE SET cpu_cores = EXCLUDED.cpu_cores, ram_gib = EXCLUDED.ram_gib,
      vram_gib = EXCLUDED.vram_gib, ttl_seconds = EXCLUDED.ttl_seconds, updated_at = compute_now()
    RETURNING pool_id, name, cpu_cores, ram_gib, vram_gib, ttl_seconds`.execute(db);
  return kindOf(rows[0]!);
}

/** The kinds of the pools the tenant owns or is offered (one pool, by id or name, with `pool`). Read-only. */
export async function listHoldKinds(
  db: Db,
  input: { tenantId: string; pool?: string | undefined },
): Promise<HoldKind[]> {
  const { rows } = await sql<HoldKindRow>`
    SELECT k.pool_id, k.name, k.cpu_cores, k.ram_gib, k.vram_gib, k.ttl_seconds
    FROM hold_kinds k JOIN pools p ON p.id = k.pool_id
    WHERE p.archived_at IS NULL
      AND (p.owner_tenant_id = ${input.tenantId}
           OR EXISTS (SELECT 1 FROM pool_offers o WHERE o.pool_id = p.id AND o.tenant_id = ${input.tenantId}))
      AND (${input.pool ?? null}::text IS NULL OR p.id = ${input.pool ?? null} OR p.name = ${input.pool ?? null})
    ORDER BY p.name, k.name`.execute(db);
  return rows.map(kindOf);
}

/** The kind `name` of the pool, or null when the pool declares none by that name. */
export async function findHoldKind(db: Db | Trx, poolId: string, name: string): Promise<HoldKind | null> {
  const { rows } = await sql<HoldKindRow>`
    SELECT pool_id, name, cpu_cores, ram_gib, vram_gib, ttl_seconds FROM hold_kinds
    WHERE pool_id = ${poolId} AND name = ${name}`.execute(db);
  return rows[0] ? kindOf(rows[0]) : null;
}
