import { listenForNodeWork, type NodeWorkListener } from '../db/nodes/command-notify.ts';
import {
  findDeliverableCommands,
  markCommandsDelivered,
  type QueuedCommandRow,
} from '../db/nodes/commands.ts';
import type { CommandLane } from '../domain/fleet.ts';
import type { GatewayContext } from './context.ts';
import type { NodeSession } from './session.ts';
import { sessionCredits } from './site-agents.ts';

/**
 * Delivers queued commands to the sessions this gateway holds, pushed rather than polled: the
 * commit that enqueues a command notifies (`notifyNodeWork`), and one dedicated LISTEN connection
 * turns each notification for a node held here into a delivery pass for that node. Passes run one
 * at a time (a lane's credits are counted from what was sent before); notifications that arrive
 * during a pass are gathered into the next one. A session opening, a command answered on a full
 * lane, and a node observing a newer spec start a pass for their node too (commands that waited
 * on them). A slow poll of every node (`commandPollMs`) covers what a notification cannot: one
 * lost while the LISTEN connection was down (it also passes over every node when it is back), a
 * `not_before` that comes due. Without a LISTEN connection (a `Db` not made by db/pool.ts) the
 * poll runs every `deliveryIntervalMs` instead.
 */
export class CommandDelivery {
  private everyNode = false;
  private readonly nodes = new Set<string>();
  private draining: Promise<void> | null = null;
  /** Nodes that had a command wait (lane full, generation not yet observed) in their last pass. */
  private readonly waiting = new Set<string>();
  private listener: NodeWorkListener | null = null;
  private poll: NodeJS.Timeout | null = null;

  constructor(private readonly ctx: GatewayContext) {}

  start(): void {
    this.listener = listenForNodeWork(this.ctx.db, {
      log: this.ctx.log,
      onWork: (nodeId) => {
        if (this.ctx.registry.sessions.has(nodeId)) this.request([nodeId]);
      },
      onListening: () => this.request(),
    });
    const pollMs = this.listener ? this.ctx.options.commandPollMs : this.ctx.options.deliveryIntervalMs;
    this.poll = setInterval(() => {
      if (!this.draining) this.request();
    }, pollMs);
  }

  async stop(): Promise<void> {
    if (this.poll) clearInterval(this.poll);
    this.poll = null;
    await this.listener?.close();
    this.listener = null;
  }

  /** The LISTEN connection: up now, and how many times it was established. */
  listening(): { listening: boolean; connections: number } {
    return { listening: this.listener?.listening ?? false, connections: this.listener?.connections ?? 0 };
  }

  /** A session opened: its node's queued commands go now. */
  sessionOpened(nodeId: string): void {
    this.request([nodeId]);
  }

  /** A node freed a lane credit or observed a newer spec: a pass only if something of it waited. */
  nodeProgressed(nodeId: string): void {
    if (this.waiting.has(nodeId)) this.request([nodeId]);
  }

  /** Asks for a pass over these nodes, or over every node held here; never rejects. */
  request(nodeIds?: readonly string[]): void {
    if (nodeIds) for (const nodeId of nodeIds) this.nodes.add(nodeId);
    else this.everyNode = true;
    this.draining ??= this.drain().finally(() => {
      this.draining = null;
    });
  }

  /** Settles once no pass is running or asked for. */
  async idle(): Promise<void> {
    while (this.draining) await this.draining;
  }

  private async drain(): Promise<void> {
    while (this.everyNode || this.nodes.size > 0) {
      const nodeIds = this.everyNode ? undefined : [...this.nodes];
      this.everyNode = false;
      this.nodes.clear();
      if (this.ctx.registry.size === 0) continue;
      try {
        await this.deliver(nodeIds);
      } catch (err) {
        // The next notification or the poll passes again.
        if (!this.ctx.outage.failed(err, 'deliver commands')) {
          this.ctx.log.warn({ err, loop: 'deliver commands' }, 'gateway loop failed');
        }
      }
    }
  }

  /** One pass: the due commands of `nodeIds` (every node held here when absent), within credits. */
  private async deliver(nodeIds: readonly string[] | undefined): Promise<void> {
    const queued = await findDeliverableCommands(this.ctx.db, this.ctx.options.gatewayId, 5000, nodeIds);
    if (nodeIds) for (const nodeId of nodeIds) this.waiting.delete(nodeId);
    else this.waiting.clear();
    if (queued.length === 0) return;
    const chosen: Array<{ session: NodeSession; command: QueuedCommandRow }> = [];
    const credits = new Map<string, Record<CommandLane, number>>();
    const blocked = new Set<string>();
    for (const { nodeId, ...command } of queued) {
      const session = this.ctx.registry.sessions.get(nodeId) as NodeSession | undefined;
      if (!session || session.closed) continue;
      let free = credits.get(nodeId);
      if (!free) {
        free = sessionCredits(this.ctx, session);
        credits.set(nodeId, free);
      }
      // Order within a lane: once a command waits, later ones of its lane wait too.
      const laneKey = `${nodeId}/${command.lane}`;
      if (blocked.has(laneKey)) continue;
      const { minGeneration } = command;
      if (free[command.lane] <= 0 || (minGeneration !== null && session.observedGeneration < minGeneration)) {
        blocked.add(laneKey);
        this.waiting.add(nodeId);
        continue;
      }
      free[command.lane]--;
      chosen.push({ session, command });
    }
    if (chosen.length === 0) return;
    const marked = await markCommandsDelivered(
      this.ctx.db,
      chosen.map((c) => ({ commandId: c.command.id, journalId: c.session.journalId })),
    );
    for (const { session, command } of chosen) {
      if (marked.has(command.id)) session.deliver(command);
    }
  }
}
