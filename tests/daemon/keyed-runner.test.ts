import { describe, expect, it } from 'vitest';
import { KeyedRunner } from '../../daemon/keyed-runner.ts';

/** A task that ends when the test says so, recording when it started. */
function gate() {
  let open!: () => void;
  const opened = new Promise<void>((resolve) => {
    open = resolve;
  });
  return { open, opened };
}

describe('KeyedRunner: in order per key, side by side across keys, bounded', () => {
  it('runs tasks of different keys at once and one key’s tasks one after another, in order', async () => {
    const runner = new KeyedRunner(4);
    const started: string[] = [];
    const gates = new Map(['a1', 'a2', 'b1', 'c1'].map((name) => [name, gate()]));
    const task = (name: string) => () => {
      started.push(name);
      return gates.get(name)!.opened.then(() => name);
    };
    const done = [
      runner.run('a', task('a1')),
      runner.run('a', task('a2')),
      runner.run('b', task('b1')),
      runner.run('c', task('c1')),
    ];
    await expect.poll(() => started).toEqual(['a1', 'b1', 'c1']);
    expect(runner.active).toBe(3);
    gates.get('a1')!.open();
    await expect.poll(() => started).toEqual(['a1', 'b1', 'c1', 'a2']);
    for (const g of gates.values()) g.open();
    expect(await Promise.all(done)).toEqual(['a1', 'a2', 'b1', 'c1']);
    expect(runner.active).toBe(0);
  });

  it('never runs more than its concurrency at once; a failed task does not stop its key', async () => {
    const runner = new KeyedRunner(2);
    let running = 0;
    let most = 0;
    const work = (fail: boolean) => async () => {
      running++;
      most = Math.max(most, running);
      await new Promise((resolve) => setTimeout(resolve, 20));
      running--;
      if (fail) throw new Error('the BMC refused');
      return 'ok';
    };
    const results = await Promise.allSettled(
      Array.from({ length: 10 }, (_, i) => runner.run(`m${i % 5}`, work(i === 0))),
    );
    expect(most).toBe(2);
    expect(results[0]).toMatchObject({ status: 'rejected' });
    expect(results.slice(1).every((r) => r.status === 'fulfilled')).toBe(true);
    expect(() => new KeyedRunner(0)).toThrow(/positive integer/);
  });
});
