import { sql, type Transaction } from 'kysely';
import type { Database, Db } from '../../core/database.ts';
import { ComputeError } from '../../domain/errors.ts';
import type { Sealed } from '../../domain/sealing.ts';
import { enqueueNodeCommand } from '../nodes/commands.ts';
import { insertJoinedNode } from '../nodes/nodes.ts';
import { requireSiteBootServer } from './site-leases.ts';

type Trx = Transaction<Database>;

/** A bare machine's BMC as the API shows it: never its credential. */
export interface MachineView {
  nodeId: string;
  name: string;
  siteId: string;
  poolId: string | null;
  provisionState: string;
  bmc: {
    address: string;
    systemId: string;
    username: string;
    powerState: 'on' | 'off' | 'unknown' | null;
    bootDevice: string | null;
    lastError: string | null;
    observedAt: Date | null;
  };
}

/**
 * Enrolls a bare machine: a node in `enrolling` in `poolId` at `siteId` and its BMC, the password
 * written only sealed, in the caller's transaction. CONFLICT when another machine already has that
 * BMC system (address and system id).
 */
export async function insertEnrolledMachine(
  trx: Trx,
  input: {
    siteId: string;
    poolId: string;
    name: string;
    address: string;
    systemId: string;
    username: string;
    passwordSealed: Sealed<'bmc-credential'>;
  },
): Promise<{ nodeId: string; name: string }> {
  const taken = await trx
    .selectFrom('bmc_endpoints')
    .where('address', '=', input.address)
    .where('system_id', '=', input.systemId)
    .select('node_id')
    .executeTakeFirst();
  if (taken) {
    throw new ComputeError(
      'CONFLICT',
      `the BMC system ${input.systemId} at ${input.address} is already enrolled as node ${taken.node_id}`,
      { nodeId: taken.node_id },
    );
  }
  const node = await insertJoinedNode(trx, {
    siteId: input.siteId,
    poolId: input.poolId,
    name: input.name,
    hardwareKey: null,
  });
  await trx
    .insertInto('bmc_endpoints')
    .values({
      node_id: node.id,
      site_id: input.siteId,
      address: input.address,
      system_id: input.systemId,
      username: input.username,
      password_sealed: input.passwordSealed,
    })
    .execute();
  return { nodeId: node.id, name: node.name };
}

const machineColumns = [
  'n.id',
  'n.name',
  'n.site_id',
  'n.pool_id',
  'n.provision_state',
  'b.address',
  'b.system_id',
  'b.username',
  'b.power_state',
  'b.boot_device',
  'b.last_error',
  'b.observed_at',
] as const;

function machineView(row: {
  id: string;
  name: string;
  site_id: string;
  pool_id: string | null;
  provision_state: string;
  address: string;
  system_id: string;
  username: string;
  power_state: 'on' | 'off' | 'unknown' | null;
  boot_device: string | null;
  last_error: string | null;
  observed_at: Date | null;
}): MachineView {
  return {
    nodeId: row.id,
    name: row.name,
    siteId: row.site_id,
    poolId: row.pool_id,
    provisionState: row.provision_state,
    bmc: {
      address: row.address,
      systemId: row.system_id,
      username: row.username,
      powerState: row.power_state,
      bootDevice: row.boot_device,
      lastError: row.last_error,
      observedAt: row.observed_at,
    },
  };
}

/** One bare machine (a node with a BMC), or null. */
export async function findMachine(db: Db | Trx, nodeId: string): Promise<MachineView | null> {
  const row = await db
    .selectFrom('bmc_endpoints as b')
    .innerJoin('nodes as n', 'n.id', 'b.node_id')
    .where('b.node_id', '=', nodeId)
    .select(machineColumns)
    .executeTakeFirst();
  return row ? machineView(row) : null;
}

/** The bare machines of a site (or of every site), by name. */
export async function listMachines(db: Db, filter: { siteId?: string }): Promise<MachineView[]> {
  let query = db
    .selectFrom('bmc_endpoints as b')
    .innerJoin('nodes as n', 'n.id', 'b.node_id')
    .select(machineColumns)
    .orderBy('n.name');
  if (filter.siteId) query = query.where('b.site_id', '=', filter.siteId);
  return (await query.execute()).map(machineView);
}

/**
 * Queues one `bmc.*` command for a machine on the site agent that holds its site's boot lease now,
 * under that lease's epoch, in the caller's transaction. The payload carries the BMC's credential
 * still sealed (the gateway opens it on the stream to the agent). NOT_FOUND for a node without a
 * BMC; UNAVAILABLE when no site agent holds the lease.
 */
export async function enqueueBmcCommand(
  trx: Trx,
  input: {
    machineNodeId: string;
    kind: 'bmc.power' | 'bmc.boot' | 'bmc.media' | 'bmc.inventory';
    args: Record<string, unknown>;
    notAfterSeconds: number;
  },
): Promise<{ commandId: string; siteAgentNodeId: string; leaseEpoch: number }> {
  const bmc = await trx
    .selectFrom('bmc_endpoints')
    .where('node_id', '=', input.machineNodeId)
    .select(['site_id', 'address', 'system_id', 'username', 'password_sealed'])
    .executeTakeFirst();
  if (!bmc) throw new ComputeError('NOT_FOUND', `node ${input.machineNodeId} has no BMC: enroll it first`);
  const server = await requireSiteBootServer(trx, bmc.site_id);
  const queued = await enqueueNodeCommand(trx, {
    nodeId: server.nodeId,
    kind: input.kind,
    payload: {
      ...input.args,
      machineNodeId: input.machineNodeId,
      leaseEpoch: server.epoch,
      bmc: {
        address: bmc.address,
        systemId: bmc.system_id,
        username: bmc.username,
        credential: bmc.password_sealed,
      },
    },
    notAfterSeconds: input.notAfterSeconds,
    byControlPlane: true,
  });
  return { commandId: queued.id, siteAgentNodeId: server.nodeId, leaseEpoch: server.epoch };
}

/**
 * After a site agent's `bmc.*` result is stored: what the BMC reported (power, boot override) on
 * the machine's BMC row and the node's power axis, or the error on a failure. Idempotent.
 */
export async function recordBmcCommandOutcome(db: Db, commandId: string): Promise<void> {
  await sql`
    WITH c AS (
      SELECT payload->>'machineNodeId' AS machine, state, result, error FROM node_commands
      WHERE id = ${commandId} AND kind LIKE 'bmc.%' AND state IN ('succeeded', 'failed', 'expired')
    ), b AS (
      UPDATE bmc_endpoints e SET
        power_state = CASE WHEN c.state = 'succeeded' THEN c.result->'system'->>'powerState' ELSE e.power_state END,
        boot_device = CASE WHEN c.state = 'succeeded' THEN c.result->'system'->>'bootDevice' ELSE e.boot_device END,
        last_error = CASE WHEN c.state = 'succeeded' THEN NULL ELSE c.error END,
        observed_at = compute_now(), updated_at = compute_now()
      FROM c WHERE e.node_id = c.machine
      RETURNING e.node_id, e.power_state
    )
    UPDATE nodes n SET power_state = b.power_state, updated_at = compute_now()
    FROM b WHERE n.id = b.node_id AND b.power_state IS NOT NULL AND n.power_state <> b.power_state`.execute(
    db,
  );
}
