import { Metadata, status } from '@grpc/grpc-js';
import type { GatewayOptions } from './options.ts';

/** What the registry needs of a session. */
export interface RegisteredSession {
  readonly nodeId: string;
  readonly epoch: number;
  lastSeenMs: number;
  fence(reason: string): void;
}

/**
 * The sessions one gateway holds, by node: at most one per node (a newer one fences the older),
 * at most `maxSessions` in all. A refusal at the limit carries `grpc-retry-pushback-ms`, jittered
 * and scaled to how many daemons the gateway is refusing, so a power-on herd spreads out.
 */
export class SessionRegistry {
  readonly sessions = new Map<string, RegisteredSession>();
  /** Connections admitted but not yet past Hello, counted against the limit. */
  private opening = 0;
  private refusals: number[] = [];
  /** Connections refused at the limit since start. */
  refusedTotal = 0;
  /** Nodes heard from since the last heartbeat flush, with the epoch of their session. */
  readonly heard = new Map<string, number>();

  constructor(private readonly options: Pick<GatewayOptions, 'maxSessions'>) {}

  /** Sessions held, connections still before Hello, and refusals at the limit since start. */
  stats(): { sessions: number; opening: number; refused: number } {
    return { sessions: this.sessions.size, opening: this.opening, refused: this.refusedTotal };
  }

  get size(): number {
    return this.sessions.size;
  }

  /** Admits a new connection, or answers the refusal to send (RESOURCE_EXHAUSTED + pushback). */
  admit(): { code: number; details: string; metadata: Metadata } | null {
    if (this.sessions.size + this.opening < this.options.maxSessions) {
      this.opening++;
      return null;
    }
    const now = Date.now(); // wall time: the refusal rate of the last 10 s, for a retry pushback
    this.refusals = this.refusals.filter((t) => now - t < 10_000);
    this.refusals.push(now);
    this.refusedTotal++;
    const spread = Math.min(30_000, 1_000 + this.refusals.length * 50);
    const pushback = Math.round(500 + Math.random() * spread);
    const metadata = new Metadata();
    metadata.set('grpc-retry-pushback-ms', String(pushback));
    return {
      code: status.RESOURCE_EXHAUSTED,
      details: `gateway at its session limit (${this.options.maxSessions}); retry in ${pushback} ms`,
      metadata,
    };
  }

  /** The admitted connection ended before or after Hello. */
  released(): void {
    if (this.opening > 0) this.opening--;
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
