import type { Transaction } from 'kysely';
import type { Database, Db } from '../../core/database.ts';
import { ComputeError } from '../../domain/errors.ts';
import { newId } from '../../domain/ids.ts';
import { canonicalJson } from '../../domain/node-spec.ts';

type Trx = Transaction<Database>;

/**
 * Creates the node of a site agent (role `site`, in no pool, so nothing is ever placed on it) in
 * the caller's transaction. A taken name gets a suffix; CONFLICT when five names are taken.
 */
export async function insertSiteAgentNode(
  trx: Trx,
  input: { siteId: string; name: string },
): Promise<{ id: string; name: string }> {
  const id = newId('node');
  for (let attempt = 0; attempt < 5; attempt++) {
    const name = attempt === 0 ? input.name : `${input.name}-${id.slice(-4 - attempt)}`;
    const inserted = await trx
      .insertInto('nodes')
      .values({
        id,
        site_id: input.siteId,
        pool_id: null,
        name,
        role: 'site',
        provision_state: 'ready',
        spec: canonicalJson({ devices: [] }),
        spec_generation: 1,
      })
      .onConflict((oc) => oc.columns(['site_id', 'name']).doNothing())
      .returning('name')
      .executeTakeFirst();
    if (inserted) return { id, name: inserted.name };
  }
  throw new ComputeError('CONFLICT', `no free node name near ${input.name} in the site`);
}

export interface SiteAgentView {
  nodeId: string;
  name: string;
  connectivity: 'connected' | 'unreachable' | 'unknown';
  agentVersion: string | null;
  lastHeartbeatAt: Date | null;
}

/** The site agents (role `site` nodes, retired ones left out) of a site, by name. */
export async function listSiteAgents(db: Db, siteId: string): Promise<SiteAgentView[]> {
  const rows = await db
    .selectFrom('nodes')
    .where('site_id', '=', siteId)
    .where('role', '=', 'site')
    .where('provision_state', '!=', 'retired')
    .select(['id', 'name', 'connectivity', 'agent_version', 'last_heartbeat_at'])
    .orderBy('name')
    .execute();
  return rows.map((r) => ({
    nodeId: r.id,
    name: r.name,
    connectivity: r.connectivity,
    agentVersion: r.agent_version,
    lastHeartbeatAt: r.last_heartbeat_at,
  }));
}
