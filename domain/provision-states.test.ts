import { describe, expect, it } from 'vitest';
import { ComputeError } from './errors.ts';
import { provisionStates } from './fleet.ts';
import { assertProvisionMove, isProvisionMove, provisionMoves } from './provision-states.ts';

describe('the provision-state table', () => {
  it('names every state, and every move leads to a state of the closed set', () => {
    expect(Object.keys(provisionMoves).sort()).toEqual([...provisionStates].sort());
    for (const [from, to] of Object.entries(provisionMoves)) {
      for (const next of to) expect(provisionStates).toContain(next);
      expect(to).not.toContain(from);
    }
  });

  it('answers every pair of states exactly as the table says (exhaustive)', () => {
    const legal = new Set(
      Object.entries(provisionMoves).flatMap(([from, to]) => to.map((next) => `${from}>${next}`)),
    );
    let checked = 0;
    for (const from of provisionStates) {
      for (const to of provisionStates) {
        expect(isProvisionMove(from, to), `${from} → ${to}`).toBe(legal.has(`${from}>${to}`));
        checked++;
      }
    }
    expect(checked).toBe(provisionStates.length ** 2);
  });

  it('keeps the lifecycle a machine goes through, and nothing leaves retired', () => {
    const path = ['enrolling', 'inspecting', 'ready', 'deploying', 'deployed', 'cleaning', 'ready'] as const;
    for (let i = 1; i < path.length; i++) expect(isProvisionMove(path[i - 1]!, path[i]!)).toBe(true);
    expect(isProvisionMove('deploying', 'ready')).toBe(false);
    expect(isProvisionMove('enrolling', 'deploying')).toBe(false);
    for (const state of provisionStates) {
      expect(isProvisionMove('retired', state)).toBe(false);
      if (state !== 'retired') expect(isProvisionMove(state, 'retired')).toBe(true);
    }
  });

  it('refuses an illegal move with INVALID_STATE naming the current state', () => {
    const refuse = () => assertProvisionMove('node_x', 'enrolling', 'deploying', 'metal.deploy');
    expect(refuse).toThrow(ComputeError);
    expect(refuse).toThrow(/node node_x is enrolling: metal.deploy needs it to become deploying/);
    try {
      refuse();
    } catch (error) {
      expect((error as ComputeError).code).toBe('INVALID_STATE');
      expect((error as ComputeError).details).toMatchObject({ provisionState: 'enrolling' });
    }
    expect(() => assertProvisionMove('node_x', 'ready', 'deploying', 'metal.deploy')).not.toThrow();
  });
});
