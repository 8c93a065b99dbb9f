import { describe, expect, it } from 'vitest';
import { minimumBatchTake, nextBatchTake } from '../../temporal/pool-placer.ts';

// What the pool-lease loop's next batch asks for, from what the last one took of what it asked.
describe('nextBatchTake', () => {
  it(`halves what a batch that was not full found when that was more than ${2 * minimumBatchTake}, so requests that came together go out in two batches`, () => {
    expect(nextBatchTake(64, 64, 41)).toBe(21);
    expect(nextBatchTake(64, 64, 60)).toBe(30);
  });

  it('takes a smaller queue whole, as batchSize allows (an empty or failed batch included)', () => {
    expect(nextBatchTake(64, 21, 20)).toBe(64);
    expect(nextBatchTake(64, 64, 2 * minimumBatchTake)).toBe(64);
    expect(nextBatchTake(64, 16, 0)).toBe(64);
  });

  it('doubles after a full batch (requests wait behind it), up to the pool’s batchSize', () => {
    expect(nextBatchTake(64, 16, 16)).toBe(32);
    expect(nextBatchTake(64, 40, 40)).toBe(64);
    expect(nextBatchTake(64, 64, 64)).toBe(64);
  });

  it('never asks for more than a batchSize smaller than the minimum', () => {
    expect(nextBatchTake(4, 4, 1)).toBe(4);
    expect(nextBatchTake(4, 4, 4)).toBe(4);
    expect(nextBatchTake(1, 1, 1)).toBe(1);
  });
});
