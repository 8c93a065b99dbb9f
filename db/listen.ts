import type pg from 'pg';
import type { Db } from '../core/database.ts';
import type { Logger } from '../core/logger.ts';
import { dedicatedClientFor } from './pool.ts';

export interface ChannelListener {
  /** Whether the LISTEN connection is up now. */
  readonly listening: boolean;
  /** How many times the LISTEN connection was (re)established. */
  readonly connections: number;
  close(): Promise<void>;
}

/**
 * Holds one dedicated connection (outside `db`'s pool) LISTENing on `channel` and calls
 * `onPayload` with each notification's payload. When the connection is lost (PostgreSQL
 * restarted, the network dropped) it reconnects with a capped backoff and calls `onListening`
 * after each LISTEN succeeds, first time included: notifications sent while it was away are lost,
 * so the caller looks at everything then. `what` names the notifications in its log lines and
 * `fallback` says what covers them meanwhile. Null when `db` was not made by db/pool.ts (no server
 * to reach): the caller polls instead.
 */
export function listenOnChannel(
  db: Db,
  input: {
    channel: string;
    log: Logger;
    what: string;
    fallback: string;
    onPayload: (payload: string) => void;
    onListening: () => void;
    /** First reconnect delay; it doubles up to `maxRetryMs`. */
    retryMs?: number;
    maxRetryMs?: number;
  },
): ChannelListener | null {
  if (!dedicatedClientFor(db)) return null;
  const retryMs = input.retryMs ?? 250;
  const maxRetryMs = input.maxRetryMs ?? 2_000;
  let client: pg.Client | null = null;
  let closed = false;
  let listening = false;
  let connections = 0;
  let delay = retryMs;
  let warned = false;
  let timer: NodeJS.Timeout | null = null;

  const lost = (current: pg.Client, err?: unknown) => {
    if (client !== current) return;
    client = null;
    listening = false;
    void current.end().catch(() => {});
    if (closed) return;
    // An info line per loss (the outage itself is the owner's one warn line); the failed
    // attempts to listen again are debug lines.
    input.log[warned ? 'debug' : 'info'](
      {
        reason: err instanceof Error ? err.message : err === undefined ? 'connection ended' : String(err),
        retryMs: delay,
      },
      `${input.what} lost: ${input.fallback}`,
    );
    warned = true;
    schedule();
  };
  const schedule = () => {
    if (closed || timer) return;
    timer = setTimeout(() => {
      timer = null;
      void connect();
    }, delay);
    timer.unref();
    delay = Math.min(maxRetryMs, delay * 2);
  };
  const connect = async () => {
    const current = dedicatedClientFor(db)!;
    client = current;
    current.on('error', (err) => lost(current, err));
    current.on('end', () => lost(current));
    current.on('notification', (message) => {
      if (message.channel === input.channel && message.payload) input.onPayload(message.payload);
    });
    try {
      await current.connect();
      await current.query(`LISTEN ${input.channel}`);
    } catch (err) {
      lost(current, err);
      return;
    }
    if (closed || client !== current) {
      void current.end().catch(() => {});
      return;
    }
    listening = true;
    connections++;
    delay = retryMs;
    warned = false;
    if (connections > 1) input.log.info({ connections }, `${input.what}: listening again`);
    input.onListening();
  };
  void connect();
  return {
    get listening() {
      return listening;
    },
    get connections() {
      return connections;
    },
    close: async () => {
      closed = true;
      if (timer) clearTimeout(timer);
      const current = client;
      client = null;
      listening = false;
      await current?.end().catch(() => {});
    },
  };
}
