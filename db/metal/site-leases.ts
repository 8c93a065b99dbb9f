import { sql, type Transaction } from 'kysely';
import type { Database, Db } from '../../core/database.ts';
import { ComputeError } from '../../domain/errors.ts';
import { inFlightCommandStates } from '../../domain/fleet.ts';
import type { StoredCommandResult } from '../nodes/commands.ts';
import { literalList } from '../sql-literals.ts';
import { commandMetalWorkflow } from './workflows.ts';

type Trx = Transaction<Database>;

/** The `site:<id>:boot` lease as stored. */
export interface SiteBootLease {
  siteId: string;
  holderNodeId: string;
  epoch: number;
  acquiredAt: Date;
  expiresAt: Date;
  /** Whether `expiresAt` has passed by the database's clock. */
  expired: boolean;
}

/** The name of a site's boot lease, as logs and the API show it. */
export function siteBootLeaseName(siteId: string): string {
  return `site:${siteId}:boot`;
}

/**
 * Takes or renews the boot lease of `siteId` for the site agent `nodeId` for `ttlMs`: renewed
 * while it already holds it unexpired; taken under epoch + 1 when nobody holds it, or the holder's
 * lease expired (by `compute_now()`). A lease held unexpired by another agent is left alone.
 * Answers the lease as it stands after the statement and whether this call began a new tenure.
 * On a new tenure the `bmc.*` commands still queued or in flight for the previous holder fail
 * ("superseded"), so whoever waits on them sends them again under the new epoch. Idempotent for a
 * holder (a renewal keeps the epoch).
 */
export async function takeSiteBootLease(
  trx: Trx,
  input: { siteId: string; nodeId: string; ttlMs: number },
): Promise<{ lease: SiteBootLease; newTenure: boolean; previousHolder: string | null }> {
  const before = await trx
    .selectFrom('site_boot_leases')
    .where('site_id', '=', input.siteId)
    .select(['holder_node_id', 'epoch', sql<boolean>`expires_at <= compute_now()`.as('expired')])
    .forUpdate()
    .executeTakeFirst();
  const ttl = sql<Date>`compute_now() + make_interval(secs => ${input.ttlMs / 1000})`;
  if (!before) {
    await trx
      .insertInto('site_boot_leases')
      .values({ site_id: input.siteId, holder_node_id: input.nodeId, epoch: 1, expires_at: ttl })
      .onConflict((oc) => oc.column('site_id').doNothing())
      .execute();
  } else if (before.holder_node_id === input.nodeId && !before.expired) {
    await trx
      .updateTable('site_boot_leases')
      .set({ renewed_at: sql<Date>`compute_now()`, expires_at: ttl })
      .where('site_id', '=', input.siteId)
      .execute();
  } else if (before.expired) {
    await trx
      .updateTable('site_boot_leases')
      .set({
        holder_node_id: input.nodeId,
        epoch: sql<string>`epoch + 1`,
        acquired_at: sql<Date>`compute_now()`,
        renewed_at: sql<Date>`compute_now()`,
        expires_at: ttl,
      })
      .where('site_id', '=', input.siteId)
      .execute();
  }
  const lease = (await findSiteBootLease(trx, input.siteId))!;
  const newTenure =
    lease.holderNodeId === input.nodeId &&
    (!before || before.expired || before.holder_node_id !== input.nodeId) &&
    lease.epoch !== Number(before?.epoch ?? 0);
  const previousHolder = before && before.holder_node_id !== input.nodeId ? before.holder_node_id : null;
  if (newTenure && previousHolder) {
    await sql`
      UPDATE node_commands SET state = 'failed', completed_at = compute_now(),
        error = ${`superseded: the boot lease of site ${input.siteId} moved to epoch ${lease.epoch}`}
      WHERE node_id = ${previousHolder} AND kind LIKE 'bmc.%'
        AND state IN ('queued', ${literalList(inFlightCommandStates)})`.execute(trx);
  }
  return { lease, newTenure, previousHolder };
}

/** A site's boot lease, or null when no agent ever held it. */
export async function findSiteBootLease(db: Db | Trx, siteId: string): Promise<SiteBootLease | null> {
  const row = await db
    .selectFrom('site_boot_leases')
    .where('site_id', '=', siteId)
    .select([
      'site_id',
      'holder_node_id',
      'epoch',
      'acquired_at',
      'expires_at',
      sql<boolean>`expires_at <= compute_now()`.as('expired'),
    ])
    .executeTakeFirst();
  if (!row) return null;
  return {
    siteId: row.site_id,
    holderNodeId: row.holder_node_id,
    epoch: Number(row.epoch),
    acquiredAt: row.acquired_at,
    expiresAt: row.expires_at,
    expired: row.expired,
  };
}

/**
 * The boot server a `bmc.*` command goes to now: the unexpired holder of the site's lease and its
 * epoch. UNAVAILABLE (retry later) when no connected site agent holds it.
 */
export async function requireSiteBootServer(
  db: Db | Trx,
  siteId: string,
): Promise<{ nodeId: string; epoch: number }> {
  const lease = await findSiteBootLease(db, siteId);
  if (!lease || lease.expired) {
    throw new ComputeError(
      'UNAVAILABLE',
      `no site agent holds ${siteBootLeaseName(siteId)}: start \`bcd site\` at the site (a standby takes over when the lease expires) and try again`,
      { retryAfterMs: 2_000 },
    );
  }
  return { nodeId: lease.holderNodeId, epoch: lease.epoch };
}

/**
 * Stores a site agent's command result like `completeDeliveredCommand`, and for a `bmc.*` command
 * only while that agent still holds the site's boot lease at the epoch the command was sent under
 * (unexpired): a stale agent's write changes nothing. Answers what was stored, or null.
 */
export async function completeSiteAgentCommand(
  db: Db,
  input: {
    nodeId: string;
    epoch: number;
    commandId: string;
    seq: number;
    state: 'succeeded' | 'failed' | 'expired';
    result: Record<string, unknown> | null;
    error: string | null;
  },
): Promise<StoredCommandResult | null> {
  const { rows } = await sql<{ metal_workflow_id: string | null }>`
    UPDATE node_commands c SET state = ${input.state},
      result = ${input.result === null ? null : JSON.stringify(input.result)}::jsonb,
      error = ${input.error}, completed_at = compute_now()
    FROM nodes n
    WHERE c.id = ${input.commandId} AND c.node_id = ${input.nodeId} AND c.seq = ${input.seq}
      AND c.state IN (${literalList(inFlightCommandStates)}) AND n.id = c.node_id AND n.epoch = ${input.epoch}
      AND (c.kind NOT LIKE 'bmc.%' OR EXISTS (
        SELECT 1 FROM site_boot_leases l
        WHERE l.site_id = n.site_id AND l.holder_node_id = c.node_id
          AND l.epoch = (c.payload->>'leaseEpoch')::bigint AND l.expires_at > compute_now()))
    RETURNING ${commandMetalWorkflow} AS metal_workflow_id`.execute(db);
  return rows[0] ? { metalWorkflowId: rows[0].metal_workflow_id } : null;
}

/** The lease epoch a site agent's `bmc.*` command was sent under, or null for another command. */
export async function findSiteCommandLeaseEpoch(db: Db, commandId: string): Promise<number | null> {
  const row = await db
    .selectFrom('node_commands')
    .where('id', '=', commandId)
    .where('kind', 'like', 'bmc.%')
    .select(sql<string | null>`payload->>'leaseEpoch'`.as('epoch'))
    .executeTakeFirst();
  return row?.epoch ? Number(row.epoch) : null;
}
