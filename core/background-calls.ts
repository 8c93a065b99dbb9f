import PQueue from 'p-queue';

/** How a BackgroundCalls queue is bounded. */
export interface BackgroundCallsOptions {
  /** Most calls running at once. */
  concurrency: number;
  /** Most calls waiting for a turn; a call asked for beyond them is dropped. */
  maxWaiting: number;
  /**
   * Told when a call is dropped because `maxWaiting` calls already wait, with how many were
   * dropped since the queue last had room (1 for the first of a burst: log that one, not each).
   */
  onDropped: (key: string, droppedInBurst: number) => void;
  /** Told when a call failed (the call's own error: nothing waits for it). */
  onError: (key: string, error: unknown) => void;
}

/**
 * Calls made after a commit that no answer waits for (a lifecycle's start or wake-up), bounded:
 * at most `concurrency` run at once and `maxWaiting` wait, and a key asked for while its call still
 * waits is not queued twice. Beyond the bound a call is dropped, not queued without end: what it
 * would have done is caught up by a sweeper that reads the truth (so a burst of commits faster
 * than the called service costs it a backlog it drains, never the caller's latency or memory).
 */
export class BackgroundCalls {
  readonly #queue: PQueue;
  readonly #waiting = new Set<string>();
  readonly #options: BackgroundCallsOptions;
  #droppedInBurst = 0;

  constructor(options: BackgroundCallsOptions) {
    this.#options = options;
    this.#queue = new PQueue({ concurrency: options.concurrency });
  }

  /** Queues `call` under `key` (once while the key waits); answers false when it was dropped. */
  schedule(key: string, call: () => Promise<unknown>): boolean {
    if (this.#waiting.has(key)) return true;
    if (this.#queue.size >= this.#options.maxWaiting) {
      this.#droppedInBurst++;
      this.#options.onDropped(key, this.#droppedInBurst);
      return false;
    }
    this.#droppedInBurst = 0;
    this.#waiting.add(key);
    void this.#queue
      .add(() => {
        this.#waiting.delete(key);
        return call();
      })
      .catch((error: unknown) => this.#options.onError(key, error));
    return true;
  }

  /** Calls running now and waiting, for logs and tests. */
  get pending(): { running: number; waiting: number } {
    return { running: this.#queue.pending, waiting: this.#queue.size };
  }

  /** Drops every call still waiting (those running go on). */
  clear(): void {
    this.#queue.clear();
    this.#waiting.clear();
  }

  /** Resolves once nothing runs or waits. */
  idle(): Promise<void> {
    return this.#queue.onIdle();
  }
}
