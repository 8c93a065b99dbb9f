import type { Db } from '../core/database.ts';
import type { Logger } from '../core/logger.ts';
import { recordBmcCommandOutcome } from '../db/metal/bmc.ts';
import {
  findSiteBootLease,
  findSiteCommandLeaseEpoch,
  siteBootLeaseName,
  takeSiteBootLease,
} from '../db/metal/site-leases.ts';
import type { QueuedCommandRow } from '../db/nodes/commands.ts';
import { ComputeError } from '../domain/errors.ts';
import type { CommandLane, NodeRole } from '../domain/fleet.ts';
import type { Sealer } from '../domain/sealing.ts';
import type { GatewayContext } from './context.ts';

/** What the lease loop reads of a session (a NodeSession; named here to keep imports one-way). */
interface SiteSessionView {
  nodeId: string;
  epoch: number;
  closed: boolean;
  lastSeenMs: number;
  log: Logger;
  peer: { role: NodeRole; siteId: string };
}

/**
 * The gateway's side of site agents: the boot lease each live site session takes or renews, the
 * BMC credential opened only on the wire, and the lease fence on a site agent's results.
 */

/**
 * A session's free credits per lane: a site agent's `provision` lane holds
 * `siteProvisionCredits` (every machine's BMC commands, run side by side), others' `credits`.
 */
export function sessionCredits(
  ctx: GatewayContext,
  session: { peer: { role: NodeRole }; credits(): Record<CommandLane, number> },
): Record<CommandLane, number> {
  const free = session.credits();
  if (session.peer.role === 'site') {
    free.provision += ctx.options.siteProvisionCredits - ctx.options.credits.provision;
  }
  return free;
}

/**
 * Takes or renews `site:<id>:boot` for every live site-agent session on this gateway (one
 * statement each; sites have few agents). A session silent for half a lease renews nothing, so its
 * lease runs out while the session's own liveness lease decides the rest.
 */
export async function renewSiteBootLeases(ctx: GatewayContext): Promise<void> {
  const now = Date.now(); // wall time: the in-process liveness of each stream
  for (const registered of ctx.registry.sessions.values()) {
    const session = registered as unknown as SiteSessionView;
    if (session.peer.role !== 'site' || session.closed || session.epoch === 0) continue;
    if (now - session.lastSeenMs > ctx.options.leaseMs / 2) continue;
    const taken = await ctx.db.transaction().execute((trx) =>
      takeSiteBootLease(trx, {
        siteId: session.peer.siteId,
        nodeId: session.nodeId,
        ttlMs: ctx.options.leaseMs,
      }),
    );
    if (taken.newTenure) {
      session.log.info(
        {
          lease: siteBootLeaseName(session.peer.siteId),
          leaseEpoch: taken.lease.epoch,
          previousHolder: taken.previousHolder,
        },
        'site boot lease taken',
      );
    }
  }
}

/**
 * The payload a command is sent with: for a `bmc.*` command, the BMC's sealed credential opened
 * with the deployment secret (it exists in the clear only on this mutual-TLS stream and in the
 * site agent's memory). A credential that does not open is sent empty, so the BMC refuses it and
 * the command fails; the reason is logged without the value.
 */
export function commandPayloadForWire(
  ctx: Pick<GatewayContext, 'sealer' | 'log'>,
  command: Pick<QueuedCommandRow, 'id' | 'kind' | 'payload'>,
): Record<string, unknown> {
  if (!command.kind.startsWith('bmc.')) return command.payload;
  const bmc = command.payload.bmc as Record<string, unknown> | undefined;
  if (!bmc || typeof bmc.credential !== 'string') return command.payload;
  let credential = '';
  try {
    if (!ctx.sealer) throw new Error('this gateway has no deployment secret');
    credential = (ctx.sealer as Sealer).open('bmc-credential', bmc.credential);
  } catch (error) {
    ctx.log.warn(
      { commandId: command.id, err: (error as Error).message },
      'the BMC credential does not open with this deployment secret: sent empty',
    );
  }
  return { ...command.payload, bmc: { ...bmc, credential } };
}

/**
 * After a site agent's result was not stored: a `bmc.*` result sent under a boot lease epoch that
 * is no longer the agent's is refused with INVALID_STATE naming both epochs (a stale boot server
 * learns it lost the lease); anything else falls through.
 */
export async function refuseStaleSiteResult(
  db: Db,
  session: { nodeId: string; siteId: string },
  commandId: string,
): Promise<void> {
  const sentUnder = await findSiteCommandLeaseEpoch(db, commandId);
  if (sentUnder === null) return;
  const lease = await findSiteBootLease(db, session.siteId);
  if (lease && lease.holderNodeId === session.nodeId && lease.epoch === sentUnder && !lease.expired) return;
  throw new ComputeError(
    'INVALID_STATE',
    `stale boot server: command ${commandId} was sent under ${siteBootLeaseName(session.siteId)} epoch ${sentUnder}, the lease is now at epoch ${lease?.epoch ?? 0}${lease && lease.holderNodeId !== session.nodeId ? ` held by ${lease.holderNodeId}` : ''}`,
    { leaseEpoch: sentUnder, currentEpoch: lease?.epoch ?? 0 },
  );
}

/** After a site agent's `bmc.*` result was stored: what the BMC reported, on the machine. */
export async function afterSiteResultStored(db: Db, commandId: string): Promise<void> {
  await recordBmcCommandOutcome(db, commandId);
}
