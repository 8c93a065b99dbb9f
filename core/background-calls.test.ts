import { describe, expect, it } from 'vitest';
import { BackgroundCalls } from './background-calls.ts';

/** A call that runs until `open()`; counts how many run at once. */
function gatedCalls() {
  let release: () => void = () => {};
  const gate = new Promise<void>((resolve) => {
    release = resolve;
  });
  const state = { running: 0, most: 0, ran: [] as string[] };
  const call = (key: string) => async () => {
    state.running++;
    state.most = Math.max(state.most, state.running);
    state.ran.push(key);
    await gate;
    state.running--;
  };
  return { state, call, open: () => release() };
}

const quiet = { onDropped: () => {}, onError: () => {} };

describe('BackgroundCalls', () => {
  it('runs at most `concurrency` calls at once and the rest in their order', async () => {
    const calls = new BackgroundCalls({ concurrency: 3, maxWaiting: 100, ...quiet });
    const { state, call, open } = gatedCalls();
    for (let i = 0; i < 10; i++) expect(calls.schedule(`r${i}`, call(`r${i}`))).toBe(true);
    expect(state.ran).toEqual(['r0', 'r1', 'r2']);
    expect(calls.pending).toEqual({ running: 3, waiting: 7 });
    open();
    await calls.idle();
    expect(state.most).toBe(3);
    expect(state.ran).toEqual(['r0', 'r1', 'r2', 'r3', 'r4', 'r5', 'r6', 'r7', 'r8', 'r9']);
  });

  it('queues a key once while it waits, and again once its call has begun', async () => {
    const calls = new BackgroundCalls({ concurrency: 1, maxWaiting: 100, ...quiet });
    const { state, call, open } = gatedCalls();
    calls.schedule('busy', call('busy'));
    expect(calls.schedule('r1', call('r1'))).toBe(true);
    expect(calls.schedule('r1', call('r1 again'))).toBe(true);
    expect(calls.pending.waiting).toBe(1);
    // `busy` runs: asked for again, it is queued behind (what it does may have been read already).
    expect(calls.schedule('busy', call('busy again'))).toBe(true);
    open();
    await calls.idle();
    expect(state.ran).toEqual(['busy', 'r1', 'busy again']);
  });

  it('drops a call beyond `maxWaiting`, telling the first of each burst apart', async () => {
    const dropped: Array<[string, number]> = [];
    const calls = new BackgroundCalls({
      concurrency: 1,
      maxWaiting: 2,
      onDropped: (key, n) => dropped.push([key, n]),
      onError: () => {},
    });
    const { state, call, open } = gatedCalls();
    for (const key of ['a', 'b', 'c', 'd', 'e']) calls.schedule(key, call(key));
    expect(dropped).toEqual([
      ['d', 1],
      ['e', 2],
    ]);
    open();
    await calls.idle();
    expect(state.ran).toEqual(['a', 'b', 'c']);
    // Room again: the next burst counts from 1 (`f` runs, `g` and `h` wait, `i` is dropped).
    for (const key of ['f', 'g', 'h', 'i']) calls.schedule(key, call(key));
    await calls.idle();
    expect(dropped).toEqual([
      ['d', 1],
      ['e', 2],
      ['i', 1],
    ]);
    expect(state.ran).toEqual(['a', 'b', 'c', 'f', 'g', 'h']);
  });

  it("hands a failed call's error to onError and goes on with the next", async () => {
    const errors: Array<[string, string]> = [];
    const calls = new BackgroundCalls({
      concurrency: 1,
      maxWaiting: 10,
      onDropped: () => {},
      onError: (key, error) => errors.push([key, (error as Error).message]),
    });
    const ran: string[] = [];
    calls.schedule('bad', async () => {
      throw new Error('Temporal is away');
    });
    calls.schedule('good', async () => {
      ran.push('good');
    });
    await calls.idle();
    expect(errors).toEqual([['bad', 'Temporal is away']]);
    expect(ran).toEqual(['good']);
  });

  it('clear() drops what waits and lets what runs finish', async () => {
    const calls = new BackgroundCalls({ concurrency: 1, maxWaiting: 10, ...quiet });
    const { state, call, open } = gatedCalls();
    for (const key of ['a', 'b', 'c']) calls.schedule(key, call(key));
    calls.clear();
    expect(calls.pending).toEqual({ running: 1, waiting: 0 });
    open();
    await calls.idle();
    expect(state.ran).toEqual(['a']);
    // A cleared key can be queued again.
    calls.schedule('b', call('b'));
    await calls.idle();
    expect(state.ran).toEqual(['a', 'b']);
  });
});
