import { describe, expect, it } from 'vitest';
import { newId } from '../../domain/ids.ts';

describe('newId', () => {
  it('mints distinct, well-formed ids across many refills of its random pool', () => {
    const ids = Array.from({ length: 20_000 }, () => newId('rsv'));
    expect(new Set(ids).size).toBe(ids.length);
    for (const id of ids.slice(0, 600)) expect(id).toMatch(/^rsv_[0-9a-hjkmnp-tv-z]{26}$/);
    // The random part: every character of the alphabet turns up, at each of its 16 places.
    for (let place = 14; place < 30; place++) {
      expect(new Set(ids.map((id) => id[place])).size).toBe(32);
    }
  });

  it('sorts by the time it was minted', async () => {
    const first = newId('evt');
    await new Promise((resolve) => setTimeout(resolve, 5));
    expect(newId('evt') > first).toBe(true);
  });
});
