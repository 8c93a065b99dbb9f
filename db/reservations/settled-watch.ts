import type { Db } from '../../core/database.ts';
import type { Logger } from '../../core/logger.ts';
import { type ChannelListener, listenOnChannel } from '../listen.ts';
import { reservationsSettledChannel } from '../notify-channels.ts';

/** A waiter's view of one reservation's settle notifications. */
export interface SettledWatch {
  /**
   * Resolves at the first settle notification for the reservation since the watch began or the
   * last `next` returned, or after `ms`, or when `signal` aborts, whichever comes first.
   */
  next(ms: number, signal?: AbortSignal): Promise<void>;
  /** Whether the LISTEN connection is up now (a notification would arrive). */
  readonly listening: boolean;
  close(): void;
}

/**
 * One LISTEN connection per `Db` on `reservationsSettledChannel`, open only while someone waits
 * (closed after 5 s without waiters), fanning the notified ids out to the watches. Kept beside
 * the `Db` it serves, as db/pool.ts keeps its pools.
 */
class SettledWatches {
  readonly #waiters = new Map<string, Set<() => void>>();
  #listener: ChannelListener | null = null;
  #idle: NodeJS.Timeout | null = null;

  constructor(
    private readonly db: Db,
    private readonly log: Logger,
  ) {}

  watch(reservationId: string): SettledWatch {
    if (this.#idle) {
      clearTimeout(this.#idle);
      this.#idle = null;
    }
    this.#listener ??= listenOnChannel(this.db, {
      channel: reservationsSettledChannel,
      log: this.log,
      what: 'reservation settle notifications',
      fallback: 'waiting creates re-read on their back-off until it listens again',
      onPayload: (payload) => {
        for (const id of payload.split(',')) for (const wake of this.#waiters.get(id) ?? []) wake();
      },
      onListening: () => {},
    });
    const listener = this.#listener;
    let notified = false;
    let resolveCurrent: (() => void) | null = null;
    const wake = () => {
      notified = true;
      resolveCurrent?.();
    };
    const set = this.#waiters.get(reservationId) ?? new Set();
    set.add(wake);
    this.#waiters.set(reservationId, set);
    return {
      next: (ms, signal) => {
        if (notified) {
          notified = false;
          return Promise.resolve();
        }
        return new Promise<void>((resolve) => {
          const done = () => {
            clearTimeout(timer);
            signal?.removeEventListener('abort', done);
            resolveCurrent = null;
            notified = false;
            resolve();
          };
          // wall time: the waiter's back-off between re-reads, not a decision
          const timer = setTimeout(done, ms);
          resolveCurrent = done;
          signal?.addEventListener('abort', done, { once: true });
        });
      },
      get listening() {
        return listener?.listening ?? false;
      },
      close: () => {
        set.delete(wake);
        if (set.size === 0) this.#waiters.delete(reservationId);
        if (this.#waiters.size === 0 && !this.#idle) {
          // wall time: how long an unused LISTEN connection is kept
          this.#idle = setTimeout(() => {
            this.#idle = null;
            if (this.#waiters.size > 0) return;
            const listener = this.#listener;
            this.#listener = null;
            void listener?.close();
          }, 5_000);
          this.#idle.unref();
        }
      },
    };
  }
}

const watchesByDb = new WeakMap<Db, SettledWatches>();

/**
 * Watches one reservation for the settle notifications of pool-lease batches (see
 * notifyReservationsSettled). Notifications are hints: a watch on a `Db` that cannot LISTEN (not
 * made by db/pool.ts) only times out, and the caller re-reads the reservation either way. Close it.
 */
export function watchSettled(db: Db, reservationId: string, log: Logger): SettledWatch {
  let watches = watchesByDb.get(db);
  if (!watches) {
    watches = new SettledWatches(db, log);
    watchesByDb.set(db, watches);
  }
  return watches.watch(reservationId);
}
