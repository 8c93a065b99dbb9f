import { randomBytes } from 'node:crypto';
import { hostname } from 'node:os';
import type { AdmissionCaches } from '../core/admission-caches.ts';
import { BackgroundCalls } from '../core/background-calls.ts';
import type { Db } from '../core/database.ts';
import type { ReservationLifecycle } from '../core/deps.ts';
import type { Logger } from '../core/logger.ts';
import { withPlacementTransaction } from '../db/allocations/placement.ts';
import {
  fenceLease,
  type HeldLease,
  LeaseLost,
  poolLeaseName,
  releaseLease,
  renewLease,
  takeLease,
} from '../db/leases.ts';
import { type ChannelListener, listenOnChannel } from '../db/listen.ts';
import { poolQueueChannel } from '../db/notify-channels.ts';
import { placeQueuedBatch, poolsToPlace, type QueuedBatch } from '../db/reservations/pool-queue.ts';

/**
 * The pool-lease placer: a leased loop in the worker process (not a Temporal workflow). For every
 * pool whose policy says `placer: 'pool-lease'`, each worker runs one loop that tries to hold the
 * lease `pool:<id>` (db/leases.ts); only the holder places. Its batches are one transaction each
 * (placeQueuedBatch), fenced by the lease's epoch in that same transaction, so a holder that
 * stalled past its lease commits nothing. It is woken by the commit that queues a request
 * (LISTEN on `bc_pool_queue`), drains the queue batch after batch, and polls slowly besides (a
 * lost notification, a lease to take over). A killed worker's lease expires after its TTL and
 * another worker's loop takes it under a higher epoch.
 */
export interface PoolPlacerOptions {
  /** How long a lease lasts without renewal (default 10 s); renewed by every batch and every third of it. */
  leaseTtlMs?: number;
  /** The slow fallback: pools re-read and free leases tried this often (default 5 s). */
  pollMs?: number;
  /** This process's name as a lease holder (default `<host>:<pid>:<random>`). */
  holder?: string;
}

export interface PoolPlacer {
  readonly holder: string;
  /** The pools whose lease this process holds now, with their epochs. */
  holding(): Map<string, number>;
  /** Batches committed so far (with at least one request). */
  readonly batches: number;
  stop(): Promise<void>;
}

export interface PoolPlacerDeps {
  db: Db;
  log: Logger;
  lifecycle: ReservationLifecycle;
  caches?: AdmissionCaches;
}

/** Below twice this many found, a batch is not split: its own reads would cost more than the wait saved. */
export const minimumBatchTake = 16;

/**
 * How many requests the next batch takes, at most the pool's `batchSize`, from what the batch
 * just booked took (`taken`) out of what it asked for (`take`). A full batch means requests wait
 * behind it: the next asks for twice as many (a bigger batch costs less per request). A batch that
 * was not full found the whole queue: when that was more than twice `minimumBatchTake`, the next
 * asks for half of it, so requests that arrive together go out in two batches that overlap (the
 * second begins once the first has booked) and the first half is answered a batch's time sooner;
 * a smaller queue is taken whole, as `batchSize` allows.
 */
export function nextBatchTake(batchSize: number, take: number, taken: number): number {
  const next = taken >= take ? take * 2 : taken > 2 * minimumBatchTake ? Math.ceil(taken / 2) : batchSize;
  return Math.min(batchSize, Math.max(Math.min(minimumBatchTake, batchSize), next));
}

/** Starts the pool-lease placer of this worker process (see PoolPlacerOptions). */
export function startPoolPlacer(deps: PoolPlacerDeps, options: PoolPlacerOptions = {}): PoolPlacer {
  const holder = options.holder ?? `${hostname()}:${process.pid}:${randomBytes(3).toString('hex')}`;
  const leaseTtlMs = options.leaseTtlMs ?? 10_000;
  const pollMs = options.pollMs ?? 5_000;
  const log = deps.log.child({ component: 'pool-placer', holder });
  const loops = new Map<string, PoolLoop>();
  const inFlight = new Set<Promise<unknown>>();
  let stopped = false;
  let batches = 0;
  let discovering: Promise<void> | null = null;
  let pollTimer: NodeJS.Timeout | null = null;

  const track = (work: Promise<unknown>) => {
    inFlight.add(work);
    void work.finally(() => inFlight.delete(work));
  };

  /**
   * The wake-ups owed after batches, bounded: batches commit faster than Temporal takes signals.
   * One dropped, or failed (not started yet: its create starts it after its own commit; or Temporal
   * is away), is covered by the lifecycle's first look or its recheck, which find it decided.
   */
  const wakes = new BackgroundCalls({
    concurrency: 32,
    maxWaiting: 10_000,
    onDropped: (reservationId, dropped) => {
      if (dropped === 1)
        log.info({ reservationId }, 'lifecycle wake-ups are behind Temporal; their own rechecks catch up');
    },
    onError: (reservationId, err) =>
      log.debug({ err, reservationId }, 'could not wake a lifecycle after its batch'),
  });

  /** After a batch commits: its reservations' lifecycles look again (the normal wake path). */
  const wakeLifecycles = (batch: QueuedBatch) => {
    for (const { reservationId } of [...batch.placed, ...batch.pending]) {
      wakes.schedule(reservationId, () =>
        deps.lifecycle.signal(reservationId, { type: 'wake', reason: 'pool-placer' }),
      );
    }
    for (const { preemption } of batch.placed) {
      if (preemption && deps.lifecycle.preempt) {
        const preempt = deps.lifecycle.preempt;
        track(
          preempt(preemption).catch((err: unknown) =>
            log.warn({ err, preemptionId: preemption.id }, 'could not start a preemption after its batch'),
          ),
        );
      }
    }
  };

  class PoolLoop {
    lease: HeldLease | null = null;
    /** Wall time of the last successful renewal (takeLease, the renewal while batches run, or the batch fence). */
    renewedAt = 0;
    kicked = false;
    done = false;
    /** What the next batch asks for (nextBatchTake), at most batchSize. */
    private take: number;
    private wake: (() => void) | null = null;
    readonly running: Promise<void>;

    constructor(
      readonly poolId: string,
      public batchSize: number,
    ) {
      this.take = batchSize;
      this.running = this.run();
    }

    kick() {
      this.kicked = true;
      this.wake?.();
    }

    private sleep(ms: number, kickable: boolean): Promise<void> {
      if (kickable && this.kicked) return Promise.resolve();
      return new Promise((resolve) => {
        // wall time: the loop's pause until the next look
        const timer = setTimeout(done, ms);
        function done() {
          clearTimeout(timer);
          resolve();
        }
        this.wake = () => {
          if (kickable || this.done) done();
        };
      });
    }

    private async run() {
      while (!stopped && !this.done) {
        let failed = false;
        try {
          await this.tick();
        } catch (err) {
          failed = true;
          if (err instanceof LeaseLost) {
            log.warn(
              { poolId: this.poolId, epoch: this.lease?.epoch },
              'lost the pool lease mid-batch; nothing of it was committed',
            );
            this.lease = null;
          } else {
            log.warn({ err, poolId: this.poolId }, 'a pool-lease batch failed; trying again');
          }
        }
        if (stopped || this.done) break;
        // A failed batch is tried again soon (its requests wait on it); a holder renews every third
        // of its TTL while idle; a standby looks at the slow poll's pace.
        const pause = failed ? 250 : this.lease ? Math.max(50, Math.floor(leaseTtlMs / 3)) : pollMs;
        await this.sleep(pause, this.lease !== null);
      }
    }

    private async ensureLease(): Promise<HeldLease | null> {
      // wall time: renewing only when a third of the TTL passed since the last renewal
      if (this.lease && Date.now() - this.renewedAt < leaseTtlMs / 3) return this.lease;
      const name = poolLeaseName(this.poolId);
      const lease = await takeLease(deps.db, { name, holder, ttlMs: leaseTtlMs });
      if (lease && lease.epoch !== this.lease?.epoch)
        log.info({ poolId: this.poolId, lease: name, epoch: lease.epoch }, 'holding the pool lease');
      this.lease = lease;
      // wall time: the same renewal clock
      if (lease) this.renewedAt = Date.now();
      return lease;
    }

    /**
     * Drains the queue while this process holds the lease: batch after batch, each next one begun
     * as soon as the one before has booked (see placeQueuedBatch's onBooked) when that one was full
     * or more requests were queued meanwhile, so a batch's commit overlaps the next one's reads and
     * planning; at most two batches at once. Returns once a batch took less than a full batch and
     * nothing more was queued, after every batch begun has ended; throws the first failure.
     */
    private async tick() {
      const lease = await this.ensureLease();
      if (!lease) return;
      // A batch may outlast the TTL (in a nearly full pool every request that fits no candidate
      // is read against the whole pool, one after the other): while batches run the lease is
      // renewed every third of it, so the lease is lost only by a holder that stalls, not by one
      // that works slowly. Without this, such a batch lost the lease before its fence, rolled
      // back, and was tried again the same way, deciding nothing for as long as the pool was full.
      const renewal = setInterval(
        () => {
          renewLease(deps.db, { ...lease, ttlMs: leaseTtlMs }).then(
            (expiresAt) => {
              // wall time: the renewal clock
              if (expiresAt) this.renewedAt = Date.now();
            },
            (err: unknown) =>
              log.warn(
                { err, poolId: this.poolId },
                'could not renew the pool lease; the batch fence decides',
              ),
          );
        },
        Math.max(50, Math.floor(leaseTtlMs / 3)),
      );
      try {
        await this.drain(lease);
      } finally {
        clearInterval(renewal);
      }
    }

    /** tick's batches under `lease`, one after the other, overlapping as tick says. */
    private async drain(lease: HeldLease) {
      let previous: Promise<unknown> = Promise.resolve();
      let failure: { error: unknown } | null = null;
      while (!failure) {
        this.kicked = false;
        const take = Math.min(this.take, this.batchSize);
        let booked: (taken: number) => void = () => {};
        const bookedOrEnded = new Promise<number>((resolve) => {
          booked = resolve;
        });
        const running = withPlacementTransaction(deps.db, (trx) =>
          placeQueuedBatch(trx, {
            poolId: this.poolId,
            batchSize: take,
            ...(deps.caches ? { caches: deps.caches } : {}),
            fence: (t) => fenceLease(t, { ...lease, ttlMs: leaseTtlMs }),
            placer: { holder, epoch: lease.epoch },
            onBooked: booked,
          }),
        ).then(
          (batch) => {
            // wall time: the fence renewed the lease in the batch's commit
            this.renewedAt = Date.now();
            if (batch.taken > 0) {
              batches++;
              log.debug(
                {
                  poolId: this.poolId,
                  epoch: lease.epoch,
                  placed: batch.placed.length,
                  pending: batch.pending.length,
                },
                'pool-lease batch committed',
              );
              wakeLifecycles(batch);
            }
            booked(batch.taken);
          },
          (error: unknown) => {
            failure ??= { error };
            booked(0);
          },
        );
        const earlier = previous;
        previous = Promise.all([earlier, running]);
        const taken = await bookedOrEnded;
        this.take = nextBatchTake(this.batchSize, take, taken);
        // The batch before this one has ended before a third would begin.
        await earlier;
        if (stopped || this.done || failure) break;
        if (taken < take && !this.kicked) {
          // Not full: the next batch only for requests queued while this one ran.
          await running;
          if (stopped || this.done || failure || !this.kicked) break;
        }
      }
      await previous;
      if (failure) throw (failure as { error: unknown }).error;
    }

    async stop() {
      this.done = true;
      this.wake?.();
      await this.running;
      if (this.lease) {
        await releaseLease(deps.db, { ...this.lease }).catch(() => {});
        this.lease = null;
      }
    }
  }

  const discover = () => {
    discovering ??= (async () => {
      try {
        const pools = await poolsToPlace(deps.db);
        const wanted = new Set(pools.map((p) => p.poolId));
        for (const pool of pools) {
          const loop = loops.get(pool.poolId);
          if (loop) {
            loop.batchSize = pool.batchSize;
            loop.kick();
          } else if (!stopped) {
            loops.set(pool.poolId, new PoolLoop(pool.poolId, pool.batchSize));
          }
        }
        for (const [poolId, loop] of loops) {
          if (wanted.has(poolId)) continue;
          loops.delete(poolId);
          track(loop.stop());
        }
      } catch (err) {
        log.warn({ err }, 'could not read the pools to place');
      } finally {
        discovering = null;
      }
    })();
    return discovering;
  };

  const listener: ChannelListener | null = listenOnChannel(deps.db, {
    channel: poolQueueChannel,
    log,
    what: 'pool queue notifications',
    fallback: `the pool placer polls every ${pollMs} ms until it listens again`,
    onPayload: (poolId) => {
      const loop = loops.get(poolId);
      if (loop) loop.kick();
      else void discover();
    },
    onListening: () => void discover(),
  });
  const poll = () => {
    if (stopped) return;
    void discover().finally(() => {
      if (stopped) return;
      // wall time: the slow fallback poll
      pollTimer = setTimeout(poll, pollMs);
    });
  };
  poll();

  return {
    holder,
    holding() {
      const held = new Map<string, number>();
      for (const [poolId, loop] of loops) if (loop.lease) held.set(poolId, loop.lease.epoch);
      return held;
    },
    get batches() {
      return batches;
    },
    async stop() {
      stopped = true;
      if (pollTimer) clearTimeout(pollTimer);
      await discovering;
      await Promise.all([...loops.values()].map((loop) => loop.stop()));
      loops.clear();
      await listener?.close();
      // Wake-ups still waiting are dropped: each lifecycle's recheck covers its own.
      wakes.clear();
      await Promise.all([...inFlight, wakes.idle()]);
    },
  };
}
