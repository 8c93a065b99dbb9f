import type { Db } from '../core/database.ts';
import type { Logger } from '../core/logger.ts';
import { createOutageLog } from '../core/outage-log.ts';
import {
  type OutboxCursor,
  type OutboxEvent,
  type OutboxFilter,
  outboxHead,
  readOutbox,
} from '../db/events/outbox-read.ts';
import { compareCursors, eventMatches } from './outbox.ts';

interface LiveFollower {
  filter: OutboxFilter;
  /** Everything up to here has been queued (or did not match). */
  cursor: OutboxCursor;
  queue: Array<{ event: OutboxEvent; position: OutboxCursor }>;
  overflowed: boolean;
  /** Resolves the follower's pending wait, if any. */
  pending: (() => void) | null;
}

function wake(follower: LiveFollower) {
  const resolve = follower.pending;
  follower.pending = null;
  resolve?.();
}

export interface OutboxHubOptions {
  pollMs?: number;
  /** A follower further behind than this many queued events reads on its own again. */
  maxQueue?: number;
}

/**
 * One reader of the outbox's tail per process, shared by every follower (the event streams): a
 * follower that resumes from an older position catches up with reads of its own, bounded by the
 * hub's position, then joins the shared tail. So N live streams cost one query per poll, not N.
 * The hub polls only while it has followers.
 */
export function createOutboxHub(deps: { db: Db; log: Logger }, options: OutboxHubOptions = {}) {
  const pollMs = options.pollMs ?? 250;
  const maxQueue = options.maxQueue ?? 10_000;
  const outage = createOutageLog(deps.log, `event streams wait; the outbox hub retries every ${pollMs} ms`);
  const live = new Set<LiveFollower>();
  let head: OutboxCursor | null = null;
  let starting: Promise<OutboxCursor> | null = null;
  // biome-ignore lint/correctness/noUnusedVariables: read by `??=` so only one poll is ever scheduled
  let timer: NodeJS.Timeout | null = null;
  let followers = 0;
  let overflows = 0;

  async function poll() {
    timer = null;
    if (followers === 0 || head === null) {
      head = null;
      return;
    }
    try {
      for (;;) {
        const page = await readOutbox(deps.db, head, { tenantId: null }, 500);
        // Synchronous from here: no follower can join between the read and the hand-out.
        for (const follower of live) {
          page.events.forEach((event, i) => {
            const position = page.positions[i]!;
            if (compareCursors(position, follower.cursor) > 0 && eventMatches(event, follower.filter)) {
              follower.queue.push({ event, position });
            }
          });
          if (compareCursors(page.cursor, follower.cursor) > 0) follower.cursor = page.cursor;
          if (follower.queue.length > maxQueue) {
            follower.overflowed = true;
            overflows++;
            live.delete(follower);
          }
          if (follower.queue.length > 0 || follower.overflowed) wake(follower);
        }
        head = page.cursor;
        if (page.events.length < 500) break;
      }
      outage.reachable('database');
    } catch (err) {
      if (!outage.failed(err, 'outbox hub')) deps.log.warn({ err }, 'outbox hub read failed; retrying');
    }
    if (followers > 0) timer = setTimeout(() => void poll(), pollMs);
    else head = null;
  }

  async function currentHead(): Promise<OutboxCursor> {
    if (head) return head;
    starting ??= outboxHead(deps.db).then((h) => {
      head = h;
      starting = null;
      timer ??= setTimeout(() => void poll(), pollMs);
      return h;
    });
    return starting;
  }

  /**
   * Batches of the events after `from` that pass `filter`, in (xid, seq) order, until `signal`
   * aborts. Yields an empty batch after `idleMs` without events (for keep-alives).
   */
  async function* follow(
    from: OutboxCursor,
    filter: OutboxFilter,
    signal: AbortSignal,
    idleMs = 15_000,
  ): AsyncGenerator<OutboxEvent[]> {
    followers++;
    let cursor = from;
    let follower: LiveFollower | null = null;
    const aborted = new Promise<'abort'>((resolve) => {
      if (signal.aborted) resolve('abort');
      signal.addEventListener('abort', () => resolve('abort'), { once: true });
    });
    try {
      while (!signal.aborted) {
        if (!follower) {
          // Catch up with reads of our own until we stand where the hub stands, then join it.
          await currentHead();
          const target = head!;
          if (compareCursors(cursor, target) >= 0) {
            // No await between the comparison and joining: the hub cannot move in between.
            follower = { filter, cursor, queue: [], overflowed: false, pending: null };
            live.add(follower);
            continue;
          }
          const page = await readOutbox(deps.db, cursor, filter, 200, target);
          cursor = page.events.length === 200 ? page.cursor : target;
          if (page.events.length > 0) yield page.events;
          continue;
        }
        if (follower.queue.length === 0 && !follower.overflowed) {
          const current = follower;
          const woken = new Promise<'event'>((resolve) => {
            current.pending = () => resolve('event');
          });
          let idle: NodeJS.Timeout | undefined;
          const timedOut = new Promise<'idle'>((resolve) => {
            idle = setTimeout(() => resolve('idle'), idleMs);
          });
          const why = await Promise.race([woken, timedOut, aborted]);
          clearTimeout(idle);
          current.pending = null;
          if (why === 'abort') return;
          if (why === 'idle') {
            yield [];
            continue;
          }
        }
        const batch = follower.queue.splice(0);
        if (batch.length > 0) {
          cursor = batch.at(-1)!.position;
          yield batch.map((b) => b.event);
        }
        if (follower.overflowed) {
          // Too far behind to be fed from memory: read on our own again from what we yielded.
          live.delete(follower);
          follower = null;
        }
      }
    } finally {
      if (follower) live.delete(follower);
      followers--;
    }
  }

  return {
    follow,
    /** How many followers are being fed from the shared tail (for tests and metrics). */
    liveFollowers: () => live.size,
    /** How many times a follower fell too far behind and went back to reading on its own. */
    overflows: () => overflows,
  };
}

export type OutboxHub = ReturnType<typeof createOutboxHub>;
