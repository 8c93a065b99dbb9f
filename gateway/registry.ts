import { Metadata, status } from '@grpc/grpc-js';
import type { GatewayOptions } from './options.ts';

/** What the registry needs of a session. */
export interface RegisteredSession {
  readonly nodeId: string;
  readonly epoch: number;
  lastSeenMs: number;
  fence(reason: string): void;
}

/** A refusal as the stream's final status: code, details and its trailers (the pushback). */
export interface StreamRefusal {
  code: number;
  details: string;
  metadata: Metadata;
}

/**
 * The sessions one gateway holds, by node: at most one per node (a newer one fences the older),
 * at most `maxSessions` in all. Only a connection that said Hello counts against that limit: one
 * still waiting for its Hello is counted per node certificate (`maxPendingHellosPerNode`) and
 * closed after `helloTimeoutMs` by its session. A refusal at the limit carries
 * `grpc-retry-pushback-ms`, jittered and scaled to how many daemons the gateway is refusing, so
 * a power-on herd spreads out.
 */
export class SessionRegistry {
  readonly sessions = new Map<string, RegisteredSession>();
  /** Sessions past Hello and being opened, counted against the limit. */
  private opening = 0;
  /** Connections before their Hello, by node; they do not count against the limit. */
  private readonly awaitingHello = new Map<string, number>();
  private awaitingHelloTotal = 0;
  private refusals: number[] = [];
  /** Connections refused at the limit since start. */
  refusedTotal = 0;
  /** Nodes heard from since the last heartbeat flush, with the epoch of their session. */
  readonly heard = new Map<string, number>();

  constructor(private readonly options: Pick<GatewayOptions, 'maxSessions' | 'maxPendingHellosPerNode'>) {}

  /** Sessions held, sessions being opened, connections before Hello, refusals at the limit. */
  stats(): { sessions: number; opening: number; awaitingHello: number; refused: number } {
    return {
      sessions: this.sessions.size,
      opening: this.opening,
      awaitingHello: this.awaitingHelloTotal,
      refused: this.refusedTotal,
    };
  }

  get size(): number {
    return this.sessions.size;
  }

  /**
   * A new connection of `nodeId` waits for its Hello; refused (RESOURCE_EXHAUSTED + pushback)
   * when that node already has `maxPendingHellosPerNode` connections waiting.
   */
  awaitHello(nodeId: string): StreamRefusal | null {
    const waiting = this.awaitingHello.get(nodeId) ?? 0;
    if (waiting >= this.options.maxPendingHellosPerNode) {
      return this.refusal(`node ${nodeId} has ${waiting} connections waiting for their Hello`);
    }
    this.awaitingHello.set(nodeId, waiting + 1);
    this.awaitingHelloTotal++;
    return null;
  }

  /** The connection of `nodeId` said Hello, or ended without one. */
  helloDone(nodeId: string): void {
    const waiting = this.awaitingHello.get(nodeId) ?? 0;
    if (waiting <= 0) return;
    if (waiting === 1) this.awaitingHello.delete(nodeId);
    else this.awaitingHello.set(nodeId, waiting - 1);
    this.awaitingHelloTotal--;
  }

  /**
   * Admits a session that said Hello, or answers the refusal to end it with (RESOURCE_EXHAUSTED +
   * pushback). A node that already holds a session here replaces it and always gets in.
   */
  admit(nodeId: string): StreamRefusal | null {
    if (this.sessions.has(nodeId) || this.sessions.size + this.opening < this.options.maxSessions) {
      this.opening++;
      return null;
    }
    return this.refusal(`gateway at its session limit (${this.options.maxSessions})`);
  }

  /** The admitted session opened (attached) or failed to. */
  released(): void {
    if (this.opening > 0) this.opening--;
  }

  private refusal(why: string): StreamRefusal {
    const now = Date.now(); // wall time: the refusal rate of the last 10 s, for a retry pushback
    this.refusals = this.refusals.filter((t) => now - t < 10_000);
    this.refusals.push(now);
    this.refusedTotal++;
    const spread = Math.min(30_000, 1_000 + this.refusals.length * 50);
    const pushback = Math.round(500 + Math.random() * spread);
    const metadata = new Metadata();
    metadata.set('grpc-retry-pushback-ms', String(pushback));
    return { code: status.RESOURCE_EXHAUSTED, details: `${why}; retry in ${pushback} ms`, metadata };
  }

  attach(session: RegisteredSession): void {
    const previous = this.sessions.get(session.nodeId);
    this.sessions.set(session.nodeId, session);
    if (previous && previous !== session) previous.fence('superseded by a newer session');
  }

  detach(session: RegisteredSession): void {
    if (this.sessions.get(session.nodeId) === session) this.sessions.delete(session.nodeId);
  }

  isCurrent(session: RegisteredSession): boolean {
    return this.sessions.get(session.nodeId) === session;
  }
}
