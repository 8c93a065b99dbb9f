import { sql } from 'kysely';
import { failInFlightCommands, type QueuedCommandRow } from '../db/nodes/commands.ts';
import { setNodeCondition } from '../db/nodes/nodes.ts';
import { ComputeError } from '../domain/errors.ts';
import type { CommandLane } from '../domain/fleet.ts';
import { inventorySections } from '../domain/inventory-sections.ts';
import type { Hello, Welcome } from '../proto/gen/agent/v1/agent.ts';
import type { GatewayContext } from './context.ts';
import { latestSectionHashes } from './inventory.ts';
import { type GatewayOptions, laneToProto } from './options.ts';

const capabilityPattern = /^[a-z0-9][a-z0-9.-]{0,63}$/;

export interface OpenedSession {
  epoch: number;
  generation: number;
  spec: Record<string, unknown>;
  wantSections: string[];
  failedInFlight: number;
  /** The node had been marked unreachable: its reservations' lifecycles should look again. */
  wasUnreachable: boolean;
  /** Commands delivered to this journal and not answered: sent again (the journal dedupes). */
  redeliver: QueuedCommandRow[];
}

/**
 * Opens a session in one transaction: increments the node's epoch (fencing any older session),
 * marks it connected on this gateway, records its agent, capabilities (as system labels
 * `bc.dev/cap.<capability>`) and journal. A journal id other than the stored one means the old
 * journal is lost: its in-flight commands fail instead of being replayed.
 */
export async function openSession(ctx: GatewayContext, nodeId: string, hello: Hello): Promise<OpenedSession> {
  if (!/^[A-Za-z0-9_-]{8,100}$/.test(hello.journalId)) {
    throw new ComputeError('INVALID_INPUT', 'Hello needs a journal id (8 to 100 characters)');
  }
  if (hello.capabilities.length > 64 || hello.agentVersion.length > 100) {
    throw new ComputeError('INVALID_INPUT', 'Hello is oversized');
  }
  const capabilities = [...new Set(hello.capabilities)].filter((c) => capabilityPattern.test(c)).sort();
  const result = await ctx.db.transaction().execute(async (trx) => {
    const before = await trx
      .selectFrom('nodes')
      .where('id', '=', nodeId)
      .select(['journal_id', 'connectivity'])
      .forUpdate()
      .executeTakeFirst();
    if (!before) throw new ComputeError('NOT_FOUND', 'the node no longer exists');
    const row = await trx
      .updateTable('nodes')
      .set({
        epoch: sql<string>`epoch + 1`,
        connectivity: 'connected',
        session_gateway: ctx.options.gatewayId,
        last_heartbeat_at: sql<Date>`compute_now()`,
        agent_version: hello.agentVersion || null,
        capabilities,
        journal_id: hello.journalId,
        power_state: 'on',
        updated_at: sql<Date>`compute_now()`,
      })
      .where('id', '=', nodeId)
      .returning(['epoch', 'spec', 'spec_generation'])
      .executeTakeFirstOrThrow();
    let failedInFlight = 0;
    if (before.journal_id && before.journal_id !== hello.journalId) {
      failedInFlight = await failInFlightCommands(trx, nodeId, 'the node lost its journal');
    }
    await trx
      .deleteFrom('node_labels')
      .where('node_id', '=', nodeId)
      .where('source', '=', 'system')
      .where('key', 'like', 'bc.dev/cap.%')
      .execute();
    for (const capability of capabilities) {
      await trx
        .insertInto('node_labels')
        .values({ node_id: nodeId, key: `bc.dev/cap.${capability}`, value: 'true', source: 'system' })
        .execute();
    }
    await setNodeCondition(trx, nodeId, null, 'NodeUnreachable');
    const redeliver = await trx
      .selectFrom('node_commands')
      .where('node_id', '=', nodeId)
      .where('state', 'in', ['delivered', 'running'])
      .where('journal_id', '=', hello.journalId)
      .select(['id', 'seq', 'kind', 'lane', 'payload', 'not_before', 'not_after', 'min_generation'])
      .orderBy('seq')
      .execute();
    return { row, failedInFlight, redeliver, wasUnreachable: before.connectivity === 'unreachable' };
  });
  const held = await latestSectionHashes(ctx.db, nodeId);
  const offered = new Map(hello.inventory.map((s) => [s.name, s.hash]));
  const wantSections = Object.keys(inventorySections).filter(
    (name) => !offered.has(name) || held.get(name) !== offered.get(name),
  );
  return {
    epoch: Number(result.row.epoch),
    generation: Number(result.row.spec_generation),
    spec: result.row.spec,
    wantSections,
    failedInFlight: result.failedInFlight,
    wasUnreachable: result.wasUnreachable,
    redeliver: result.redeliver.map((c) => ({
      id: c.id,
      seq: Number(c.seq),
      kind: c.kind,
      lane: c.lane,
      payload: c.payload,
      notBefore: c.not_before,
      notAfter: c.not_after,
      minGeneration: c.min_generation === null ? null : Number(c.min_generation),
    })),
  };
}

/** The Welcome that answers a Hello: epoch, heartbeat interval, lease, wanted sections, credits. */
export function welcomeFor(options: GatewayOptions, opened: OpenedSession): Welcome {
  return {
    epoch: opened.epoch,
    heartbeatIntervalMs: options.heartbeatIntervalMs,
    leaseMs: options.leaseMs,
    wantSections: opened.wantSections,
    credits: (Object.keys(options.credits) as CommandLane[]).map((lane) => ({
      lane: laneToProto[lane],
      credits: options.credits[lane],
    })),
    gatewayId: options.gatewayId,
  };
}

/** A session's message budget: `perSecond` on average, bursts up to `burst`. */
export class TokenBucket {
  private tokens: number;
  private last = Date.now();

  constructor(
    private readonly perSecond: number,
    private readonly burst: number,
  ) {
    this.tokens = burst;
  }

  take(): boolean {
    const now = Date.now();
    this.tokens = Math.min(this.burst, this.tokens + ((now - this.last) / 1000) * this.perSecond);
    this.last = now;
    if (this.tokens < 1) return false;
    this.tokens -= 1;
    return true;
  }
}
