import { describe, expect, it } from 'vitest';
import { calendarHorizonDays, poolPolicySchema, readPoolPolicy, spotNoticeSeconds } from './pool-policy.ts';

describe('pool policy', () => {
  it('validates every knob strictly', () => {
    expect(
      poolPolicySchema.safeParse({ spot: { noticeSeconds: 300 }, calendar: { horizonDays: 30 } }).success,
    ).toBe(true);
    expect(poolPolicySchema.safeParse({ spot: { notice: 300 } }).success).toBe(false);
    expect(poolPolicySchema.safeParse({ timers: { usageWindowMs: 60_000 } }).success).toBe(false);
    expect(poolPolicySchema.safeParse({ unknownKnob: true }).success).toBe(false);
  });

  it('reads a stored document knob by knob, never throwing, with defaults', () => {
    const read = readPoolPolicy({ spot: { noticeSeconds: -5 }, calendar: { horizonDays: 7 }, legacy: 1 });
    expect(read).toEqual({ calendar: { horizonDays: 7 } });
    expect(spotNoticeSeconds(read)).toBe(120);
    expect(calendarHorizonDays(read)).toBe(7);
    expect(readPoolPolicy('not json')).toEqual({});
    expect(readPoolPolicy(JSON.stringify({ maxPendingSeconds: 600 }))).toEqual({ maxPendingSeconds: 600 });
  });
});
