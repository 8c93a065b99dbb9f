import { describe, expect, it } from 'vitest';
import { reservationSnapshot } from '../tests/support/reservation-snapshot.ts';
import { decide } from './reservation-lifecycle.ts';
import {
  isCancellable,
  isExtendable,
  isLive,
  isPlaced,
  isRenewable,
  isTerminal,
  isUndecided,
  reservationStates,
} from './reservation-states.ts';

/** Which states each predicate holds for, spelled out: a change to a group shows up here. */
const expected = {
  isTerminal: ['denied', 'released', 'failed', 'cancelled', 'expired'],
  isLive: ['awaiting-confirmation', 'pending', 'placed', 'binding', 'active', 'releasing'],
  isUndecided: ['draft', 'awaiting-confirmation'],
  isCancellable: ['awaiting-confirmation', 'pending', 'placed'],
  isRenewable: ['placed', 'binding', 'active'],
  isExtendable: ['placed', 'binding', 'active'],
  isPlaced: ['placed', 'binding', 'active', 'releasing'],
};

const predicates = { isTerminal, isLive, isUndecided, isCancellable, isRenewable, isExtendable, isPlaced };

describe('reservation state predicates', () => {
  for (const [name, predicate] of Object.entries(predicates)) {
    it(`${name} holds for exactly its states`, () => {
      expect(reservationStates.filter((state) => predicate(state))).toEqual(
        reservationStates.filter((state) => expected[name as keyof typeof expected].includes(state)),
      );
    });
  }

  it('a state is a draft, live or terminal, exactly one of them', () => {
    for (const state of reservationStates) {
      expect([state === 'draft', isLive(state), isTerminal(state)].filter(Boolean)).toHaveLength(1);
    }
  });

  it('the lifecycle finishes in exactly the terminal states and drafts', () => {
    for (const state of reservationStates) {
      const s = reservationSnapshot({ state });
      const intents = { release: false, cancel: false, confirmation: null, capacityFreed: false };
      const finishes =
        decide(s, intents, { lastPlaceAttemptAt: null, meteredThrough: null }).kind === 'finish';
      expect(finishes, state).toBe(isTerminal(state) || state === 'draft');
    }
  });

  it('an unknown string is in no group', () => {
    for (const predicate of Object.values(predicates)) expect(predicate('paused')).toBe(false);
  });
});
