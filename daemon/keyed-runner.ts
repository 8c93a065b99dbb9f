/**
 * Runs tasks in order per key and side by side across keys, at most `concurrency` at once: what a
 * site agent needs to drive many machines' BMCs together while each machine's commands stay in
 * the order they were sent. A task waits for the previous task of its key to settle, then for a
 * free slot (slots are handed out first come, first served).
 */
export class KeyedRunner {
  private readonly tails = new Map<string, Promise<void>>();
  private readonly waiting: Array<() => void> = [];
  private running = 0;

  constructor(readonly concurrency: number) {
    if (!Number.isInteger(concurrency) || concurrency < 1) {
      throw new Error(`concurrency must be a positive integer, got ${concurrency}`);
    }
  }

  /** Tasks running now. */
  get active(): number {
    return this.running;
  }

  /** Runs `task` after every earlier task of `key`; settles as the task does. */
  run<T>(key: string, task: () => Promise<T>): Promise<T> {
    const previous = this.tails.get(key) ?? Promise.resolve();
    const next = previous.then(async () => {
      await this.slot();
      try {
        return await task();
      } finally {
        this.release();
      }
    });
    const tail = next.then(
      () => {},
      () => {},
    );
    this.tails.set(key, tail);
    void tail.then(() => {
      if (this.tails.get(key) === tail) this.tails.delete(key);
    });
    return next;
  }

  private slot(): Promise<void> {
    if (this.running < this.concurrency) {
      this.running++;
      return Promise.resolve();
    }
    return new Promise((resolve) => this.waiting.push(resolve));
  }

  private release(): void {
    const nextInLine = this.waiting.shift();
    // The slot passes straight to the next waiter, so `running` stays counted.
    if (nextInLine) nextInLine();
    else this.running--;
  }
}
