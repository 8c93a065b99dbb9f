import { sql } from 'kysely';
import type { QueuedCommandRow } from '../db/nodes/commands.ts';
import { expireOverdueCommands, failTimedOutCommands } from '../db/nodes/commands.ts';
import type { CommandLane } from '../domain/fleet.ts';
import type { GatewayContext } from './context.ts';
import type { NodeSession } from './session.ts';
import { wakeReservationsOnNodes } from './wake.ts';

/**
 * The gateway's loops: delivery (changed NodeSpecs and queued commands for the nodes this gateway
 * holds, every `deliveryIntervalMs`), heartbeat flushes (one statement a second for all sessions),
 * and liveness (a session silent past its lease ends, its node becomes unreachable with the
 * `NodeUnreachable` condition; nothing it holds is released).
 */
export class Dispatcher {
  private timers: NodeJS.Timeout[] = [];
  private running = new Set<string>();

  constructor(private readonly ctx: GatewayContext) {}

  start(): void {
    const every = (name: string, ms: number, task: () => Promise<void>) => {
      this.timers.push(
        setInterval(() => {
          if (this.running.has(name)) return;
          this.running.add(name);
          task()
            .catch((err: unknown) => this.ctx.log.warn({ err, loop: name }, 'gateway loop failed'))
            .finally(() => this.running.delete(name));
        }, ms),
      );
    };
    every('deliver', this.ctx.options.deliveryIntervalMs, () => this.deliver());
    every('heartbeats', Math.min(1_000, this.ctx.options.leaseMs / 4), () => this.flushHeartbeats());
    every('liveness', Math.min(2_000, this.ctx.options.leaseMs / 4), () => this.sweepLiveness());
    every('certificates', this.ctx.options.certificateCheckMs, () => this.recheckCertificates());
  }

  stop(): void {
    for (const timer of this.timers) clearInterval(timer);
    this.timers = [];
  }

  private session(nodeId: string): NodeSession | undefined {
    return this.ctx.registry.sessions.get(nodeId) as NodeSession | undefined;
  }

  async deliver(): Promise<void> {
    if (this.ctx.registry.size === 0) return;
    const gatewayId = this.ctx.options.gatewayId;
    const specs = await sql<{ id: string; spec: Record<string, unknown>; spec_generation: string }>`
      SELECT id, spec, spec_generation FROM nodes
      WHERE session_gateway = ${gatewayId} AND spec_generation > COALESCE(observed_generation, 0)`.execute(
      this.ctx.db,
    );
    for (const row of specs.rows) {
      this.session(row.id)?.pushSpec(Number(row.spec_generation), row.spec);
    }
    const queued = await sql<{
      id: string;
      node_id: string;
      seq: string;
      kind: string;
      lane: CommandLane;
      payload: Record<string, unknown>;
      not_before: Date | null;
      not_after: Date | null;
      min_generation: string | null;
    }>`
      SELECT c.id, c.node_id, c.seq, c.kind, c.lane, c.payload, c.not_before, c.not_after, c.min_generation
      FROM node_commands c JOIN nodes n ON n.id = c.node_id
      WHERE c.state = 'queued' AND n.session_gateway = ${gatewayId}
        AND (c.not_before IS NULL OR c.not_before <= compute_now())
        AND (c.not_after IS NULL OR c.not_after > compute_now())
      ORDER BY c.node_id, c.seq
      LIMIT 5000`.execute(this.ctx.db);
    if (queued.rows.length === 0) return;
    const chosen: Array<{ session: NodeSession; command: QueuedCommandRow }> = [];
    const credits = new Map<string, Record<CommandLane, number>>();
    const blocked = new Set<string>();
    for (const row of queued.rows) {
      const session = this.session(row.node_id);
      if (!session || session.closed) continue;
      let free = credits.get(row.node_id);
      if (!free) {
        free = session.credits();
        credits.set(row.node_id, free);
      }
      // Order within a lane: once a command waits, later ones of its lane wait too.
      const laneKey = `${row.node_id}/${row.lane}`;
      if (blocked.has(laneKey)) continue;
      const minGeneration = row.min_generation === null ? null : Number(row.min_generation);
      if (free[row.lane] <= 0 || (minGeneration !== null && session.observedGeneration < minGeneration)) {
        blocked.add(laneKey);
        continue;
      }
      free[row.lane]--;
      chosen.push({
        session,
        command: {
          id: row.id,
          seq: Number(row.seq),
          kind: row.kind,
          lane: row.lane,
          payload: row.payload,
          notBefore: row.not_before,
          notAfter: row.not_after,
          minGeneration,
        },
      });
    }
    if (chosen.length === 0) return;
    const marked = await sql<{ id: string }>`
      UPDATE node_commands c SET state = 'delivered', delivered_at = compute_now(), journal_id = t.journal
      FROM unnest(${chosen.map((c) => c.command.id)}::text[], ${chosen.map((c) => c.session.journalId)}::text[])
        AS t(id, journal)
      WHERE c.id = t.id AND c.state = 'queued'
      RETURNING c.id`.execute(this.ctx.db);
    const ok = new Set(marked.rows.map((r) => r.id));
    for (const { session, command } of chosen) {
      if (ok.has(command.id)) session.deliver(command);
    }
  }

  async flushHeartbeats(): Promise<void> {
    const now = Date.now();
    for (const session of this.ctx.registry.sessions.values()) {
      if (now - session.lastSeenMs > this.ctx.options.leaseMs) void this.lapse(session as NodeSession);
    }
    const heard = this.ctx.registry.heard;
    if (heard.size === 0) return;
    const ids = [...heard.keys()].sort();
    const epochs = ids.map((id) => heard.get(id)!);
    heard.clear();
    const gatewayId = this.ctx.options.gatewayId;
    // A node the database wrongly thinks silent (another gateway's sweep during a pause, a moved
    // clock) while its session here is alive is connected again by its next heartbeat.
    // Rows are locked in id order (the liveness sweep skips locked rows), so the two never deadlock.
    const revived = await this.ctx.db
      .transaction()
      .execute(async (trx) => {
        const { rows } = await sql<{ id: string }>`
        WITH locked AS (
          SELECT n.id FROM nodes n
          JOIN unnest(${ids}::text[], ${epochs}::bigint[]) AS t(id, epoch) ON n.id = t.id AND n.epoch = t.epoch
          ORDER BY n.id FOR UPDATE OF n
        )
        UPDATE nodes n SET last_heartbeat_at = compute_now(), connectivity = 'connected',
          session_gateway = ${gatewayId}
        FROM locked WHERE n.id = locked.id
        RETURNING n.id, (SELECT o.connectivity <> 'connected' OR o.session_gateway IS DISTINCT FROM ${gatewayId}
                         FROM nodes o WHERE o.id = n.id) AS was_lost`.execute(trx);
        const lost = rows.filter((r) => (r as { was_lost?: boolean }).was_lost).map((r) => r.id);
        if (lost.length > 0) {
          await trx
            .deleteFrom('node_conditions')
            .where('node_id', 'in', lost)
            .where('type', '=', 'NodeUnreachable')
            .execute();
        }
        return lost;
      })
      .catch((error: unknown) => {
        // Put the batch back (unless a newer heartbeat already replaced it) for the next flush.
        ids.forEach((id, i) => {
          if (!heard.has(id)) heard.set(id, epochs[i]!);
        });
        throw error;
      });
    if (revived.length > 0) {
      this.ctx.log.info({ nodeIds: revived.slice(0, 20), count: revived.length }, 'nodes connected again');
      await wakeReservationsOnNodes(this.ctx, revived, 'node-reconnected');
    }
  }

  /** Ends every live session whose certificate was revoked (or expired) since it opened. */
  async recheckCertificates(): Promise<void> {
    const sessions = [...this.ctx.registry.sessions.values()] as NodeSession[];
    if (sessions.length === 0) return;
    const { rows } = await sql<{ serial: string }>`
      SELECT serial FROM node_certificates
      WHERE serial = ANY(${sessions.map((s) => s.peer.serial)}::text[])
        AND (revoked_at IS NOT NULL OR not_after <= compute_now())`.execute(this.ctx.db);
    if (rows.length === 0) return;
    const bad = new Set(rows.map((r) => r.serial));
    for (const session of sessions) {
      if (!bad.has(session.peer.serial)) continue;
      session.log.warn({ serial: session.peer.serial }, 'certificate revoked or expired: session ended');
      session.end(16, 'the node certificate was revoked or expired');
    }
  }

  /** A silent session: end it and mark its node unreachable (only if it still holds the epoch). */
  private async lapse(session: NodeSession): Promise<void> {
    if (session.closed) return;
    session.log.warn({ epoch: session.epoch }, 'liveness lease lapsed');
    session.end(14, 'liveness lease lapsed');
    await this.markUnreachable(
      sql<{ id: string }>`
        UPDATE nodes SET connectivity = 'unreachable', session_gateway = NULL, updated_at = compute_now()
        WHERE id = ${session.nodeId} AND epoch = ${session.epoch} RETURNING id`,
    );
  }

  /** Nodes whose heartbeats stopped reaching any gateway for a whole lease. */
  async sweepLiveness(): Promise<void> {
    const leaseSeconds = this.ctx.options.leaseMs / 1000;
    await this.markUnreachable(
      sql<{ id: string }>`
        WITH stale AS (
          SELECT id FROM nodes
          WHERE connectivity = 'connected'
            AND (last_heartbeat_at IS NULL OR last_heartbeat_at < compute_now() - make_interval(secs => ${leaseSeconds}))
          ORDER BY id FOR UPDATE SKIP LOCKED
        )
        UPDATE nodes SET connectivity = 'unreachable', session_gateway = NULL, updated_at = compute_now()
        FROM stale WHERE nodes.id = stale.id
        RETURNING nodes.id`,
    );
    await expireOverdueCommands(this.ctx.db);
    await failTimedOutCommands(this.ctx.db);
  }

  private async markUnreachable(update: ReturnType<typeof sql<{ id: string }>>): Promise<void> {
    const ids = await this.ctx.db.transaction().execute(async (trx) => {
      const rows = (await update.execute(trx)).rows;
      if (rows.length === 0) return [];
      await sql`
        INSERT INTO node_conditions (node_id, type, reason, message, effect)
        SELECT id, 'NodeUnreachable', 'Unreachable', 'no heartbeat within the liveness lease', 'NoSchedule'
        FROM unnest(${rows.map((r) => r.id)}::text[]) AS id
        ON CONFLICT (node_id, type) DO UPDATE SET updated_at = compute_now()`.execute(trx);
      this.ctx.log.warn(
        { nodeIds: rows.map((r) => r.id).slice(0, 20), count: rows.length },
        'nodes unreachable',
      );
      return rows.map((r) => r.id);
    });
    await wakeReservationsOnNodes(this.ctx, ids, 'node-unreachable');
  }
}
