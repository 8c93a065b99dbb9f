import type { Transaction } from 'kysely';
import type { Database } from '../core/database.ts';
import { transactionRetryingConflicts } from '../db/conflict-retry.ts';
import { findInvalidCertificateSerials } from '../db/nodes/certificates.ts';
import { expireOverdueCommands, failTimedOutCommands } from '../db/nodes/commands.ts';
import {
  findSpecsToSend,
  markSessionUnreachable,
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
  readonly commands: CommandDelivery;

  constructor(private readonly ctx: GatewayContext) {
    this.commands = new CommandDelivery(ctx);
  }

  start(): void {
    /** `probe`: the task always queries PostgreSQL, so its success ends an outage. */
    const every = (name: string, ms: number, task: () => Promise<void>, probe = false) => {
      this.timers.push(
        setInterval(() => {
          if (this.running.has(name)) return;
          this.running.add(name);
          task()
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
            .finally(() => this.running.delete(name));
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

  async stop(): Promise<void> {
    for (const timer of this.timers) clearInterval(timer);
    this.timers = [];
    await this.commands.stop();
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
    for (const session of this.ctx.registry.sessions.values()) {
      if (now - session.lastSeenMs > this.ctx.options.leaseMs) {
        // A lapse that fails to write is only logged: its node's stale heartbeat is the sweep's.
        void this.lapse(session as NodeSession).catch((err: unknown) => {
          if (!this.ctx.outage.failed(err, 'lapse'))
            this.ctx.log.warn({ err }, 'marking a lapsed node failed');
        });
      }
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

  /** A silent session: end it and mark its node unreachable (only if it still holds the epoch). */
  private async lapse(session: NodeSession): Promise<void> {
    if (session.closed) return;
    session.log.warn({ epoch: session.epoch }, 'liveness lease lapsed');
    session.end(14, 'liveness lease lapsed');
    await this.markUnreachable((trx) => markSessionUnreachable(trx, session));
  }

  /** Nodes whose heartbeats stopped reaching any gateway for a whole lease. */
  async sweepLiveness(): Promise<void> {
    const leaseSeconds = this.ctx.options.leaseMs / 1000;
    await this.markUnreachable((trx) => markSilentNodesUnreachable(trx, leaseSeconds));
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
