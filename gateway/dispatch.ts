import type { Transaction } from 'kysely';
import type { Database } from '../core/database.ts';
import { transactionRetryingConflicts } from '../db/conflict-retry.ts';
import { findInvalidCertificateSerials } from '../db/nodes/certificates.ts';
import { expireOverdueCommands, failTimedOutCommands } from '../db/nodes/commands.ts';
import {
  findSpecsToSend,
  markSessionsUnreachable,
  markSilentNodesUnreachable,
  recordHeartbeats,
} from '../db/nodes/sessions.ts';
import { CommandDelivery } from './command-delivery.ts';
import type { GatewayContext } from './context.ts';
import type { NodeSession } from './session.ts';
import { renewSiteBootLeases } from './site-agents.ts';
import { wakeReservationsOnNodes } from './wake.ts';

/**
 * The gateway's loops: delivery (changed NodeSpecs for the nodes this gateway holds, every
 * `deliveryIntervalMs`; queued commands are pushed, `commands`), heartbeat flushes (one statement a second for all sessions),
 * and liveness (a session silent past its lease ends, its node becomes unreachable with the
 * `NodeUnreachable` condition; nothing it holds is released).
 */
export class Dispatcher {
  private timers: NodeJS.Timeout[] = [];
  private running = new Set<string>();
  /** The loops' runs under way, which stop() waits for. */
  private readonly inFlight = new Set<Promise<void>>();
  readonly commands: CommandDelivery;
  /** When a loop's timer last fired (wall time), to notice this process standing still. */
  private lastTickMs = 0;
  /**
   * When this process last resumed from standing still for half a lease or more (its event loop
   * blocked, the process starved or paused). The sessions' data is then still unread in their
   * sockets: no session lapses, and the sweep marks nothing, until a lease has passed since.
   */
  private resumedAtMs = Number.NEGATIVE_INFINITY;

  constructor(private readonly ctx: GatewayContext) {
    this.commands = new CommandDelivery(ctx);
  }

  start(): void {
    /** `probe`: the task always queries PostgreSQL, so its success ends an outage. */
    const every = (name: string, ms: number, task: () => Promise<void>, probe = false) => {
      this.timers.push(
        setInterval(() => {
          this.tick();
          if (this.running.has(name)) return;
          this.running.add(name);
          const run: Promise<void> = task()
            .then(
              () => {
                if (probe) this.ctx.outage.reachable('database');
              },
              (err: unknown) => {
                if (!this.ctx.outage.failed(err, name)) {
                  this.ctx.log.warn({ err, loop: name }, 'gateway loop failed');
                }
              },
            )
            .finally(() => {
              this.running.delete(name);
              this.inFlight.delete(run);
            });
          this.inFlight.add(run);
        }, ms),
      );
    };
    every('deliver', this.ctx.options.deliveryIntervalMs, () => this.deliverSpecs());
    this.commands.start();
    every('heartbeats', Math.min(1_000, this.ctx.options.leaseMs / 4), () => this.flushHeartbeats());
    every('liveness', Math.min(2_000, this.ctx.options.leaseMs / 4), () => this.sweepLiveness(), true);
    every('certificates', this.ctx.options.certificateCheckMs, () => this.recheckCertificates());
    every('site-leases', Math.min(1_000, this.ctx.options.leaseMs / 4), () => renewSiteBootLeases(this.ctx));
  }

  /**
   * Every loop's timer calls this first, so the first to fire after a stall notices it (before
   * the heartbeat flush or the sweep acts on liveness it could not observe).
   */
  private tick(): void {
    const now = Date.now(); // wall time: how long this process stood still between timers
    const stalledMs = this.lastTickMs === 0 ? 0 : now - this.lastTickMs;
    this.lastTickMs = now;
    if (stalledMs < this.ctx.options.leaseMs / 2) return;
    this.resumedAtMs = now;
    this.ctx.log.warn(
      { stalledMs, sessions: this.ctx.registry.size },
      'the gateway stood still: no session lapses and no node is swept for one lease',
    );
  }

  /**
   * Stops the loops and waits for the runs already under way: a sweep is several transactions, and
   * its next one must not begin after the caller has closed the database (a 10,000-node herd's
   * gateway logged "driver has already been destroyed" from a liveness sweep as it stopped).
   */
  async stop(): Promise<void> {
    for (const timer of this.timers) clearInterval(timer);
    this.timers = [];
    await this.commands.stop();
    await Promise.all(this.inFlight);
  }

  private session(nodeId: string): NodeSession | undefined {
    return this.ctx.registry.sessions.get(nodeId) as NodeSession | undefined;
  }

  async deliverSpecs(): Promise<void> {
    if (this.ctx.registry.size === 0) return;
    const specs = await findSpecsToSend(this.ctx.db, this.ctx.options.gatewayId);
    for (const { nodeId, generation, spec } of specs) this.session(nodeId)?.pushSpec(generation, spec);
  }

  async flushHeartbeats(): Promise<void> {
    const now = Date.now(); // wall time: the in-process liveness lease of each stream
    const lapsed: NodeSession[] = [];
    // A session is silent for a lease only if this process was running to hear it all that time.
    const since = (session: { lastSeenMs: number }) => Math.max(session.lastSeenMs, this.resumedAtMs);
    for (const session of this.ctx.registry.sessions.values()) {
      if (now - since(session) > this.ctx.options.leaseMs) lapsed.push(session as NodeSession);
    }
    if (lapsed.length > 0) {
      // A lapse that fails to write is only logged: its node's stale heartbeat is the sweep's.
      void this.lapse(lapsed).catch((err: unknown) => {
        if (!this.ctx.outage.failed(err, 'lapse')) this.ctx.log.warn({ err }, 'marking lapsed nodes failed');
      });
    }
    const heard = this.ctx.registry.heard;
    if (heard.size === 0) return;
    const batch = [...heard.keys()].sort().map((nodeId) => ({ nodeId, epoch: heard.get(nodeId)! }));
    heard.clear();
    // Put heartbeats back (unless a newer one already replaced them) for the next flush.
    const putBack = (fences: ReadonlyArray<{ nodeId: string; epoch: number }>) => {
      for (const { nodeId, epoch } of fences) if (!heard.has(nodeId)) heard.set(nodeId, epoch);
    };
    // A node the database wrongly thinks silent (another gateway's sweep during a pause, a moved
    // clock) while its session here is alive is connected again by its next heartbeat. A deadlock
    // or serialization conflict is retried; a batch that still fails waits for the next flush.
    const { revived, deferred } = await transactionRetryingConflicts(this.ctx.db, (trx) =>
      recordHeartbeats(trx, this.ctx.options.gatewayId, batch),
    ).catch((error: unknown) => {
      putBack(batch);
      throw error;
    });
    // Rows another transaction held were skipped rather than waited for: the next flush writes them.
    putBack(deferred);
    if (revived.length > 0) {
      this.ctx.log.info({ nodeIds: revived.slice(0, 20), count: revived.length }, 'nodes connected again');
      await wakeReservationsOnNodes(this.ctx, revived, 'node-reconnected');
    }
  }

  /** Ends every live session whose certificate was revoked (or expired) since it opened. */
  async recheckCertificates(): Promise<void> {
    const sessions = [...this.ctx.registry.sessions.values()] as NodeSession[];
    if (sessions.length === 0) return;
    const invalid = await findInvalidCertificateSerials(
      this.ctx.db,
      sessions.map((s) => s.peer.serial),
    );
    if (invalid.length === 0) return;
    const bad = new Set(invalid);
    for (const session of sessions) {
      if (!bad.has(session.peer.serial)) continue;
      session.log.warn({ serial: session.peer.serial }, 'certificate revoked or expired: session ended');
      session.end(16, 'the node certificate was revoked or expired');
    }
  }

  /**
   * Silent sessions: each ends, and their nodes are marked unreachable in one statement (each only
   * while its session still holds the epoch). However many lapse at once, it is one transaction.
   */
  private async lapse(sessions: readonly NodeSession[]): Promise<void> {
    const fences = sessions
      .filter((session) => !session.closed)
      .map((session) => {
        session.end(14, 'liveness lease lapsed');
        return { nodeId: session.nodeId, epoch: session.epoch };
      });
    if (fences.length === 0) return;
    this.ctx.log.warn(
      { nodeIds: fences.slice(0, 20).map((f) => f.nodeId), count: fences.length },
      'liveness lease lapsed',
    );
    await this.markUnreachable((trx) => markSessionsUnreachable(trx, fences));
  }

  /** Nodes whose heartbeats stopped reaching any gateway for a whole lease. */
  async sweepLiveness(): Promise<void> {
    const leaseSeconds = this.ctx.options.leaseMs / 1000;
    // After this process stood still, its own nodes' heartbeats are in its sockets, not yet in
    // PostgreSQL: the sweep waits a lease (another gateway's sweep still runs).
    // wall time: compared with the in-process resume time
    const resumedRecently = Date.now() - this.resumedAtMs < this.ctx.options.leaseMs;
    if (!resumedRecently) await this.markUnreachable((trx) => markSilentNodesUnreachable(trx, leaseSeconds));
    await transactionRetryingConflicts(this.ctx.db, (trx) => expireOverdueCommands(trx));
    await transactionRetryingConflicts(this.ctx.db, (trx) => failTimedOutCommands(trx));
  }

  private async markUnreachable(mark: (trx: Transaction<Database>) => Promise<string[]>): Promise<void> {
    // The sweep skips held rows and a lapse locks one row, but a conflict is retried all the same.
    const ids = await transactionRetryingConflicts(this.ctx.db, mark);
    if (ids.length > 0) {
      this.ctx.log.warn({ nodeIds: ids.slice(0, 20), count: ids.length }, 'nodes unreachable');
    }
    await wakeReservationsOnNodes(this.ctx, ids, 'node-unreachable');
  }
}
