import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { durationPatternWithin, durationUnitMs, parseDuration } from './duration.ts';
import { maxDurationMs, minDurationMs } from './reservation-schema.ts';

type Unit = keyof typeof durationUnitMs;
const units = Object.keys(durationUnitMs) as Unit[];

/** Whether `whole.fraction` times the unit lies within [min, max], in exact integer arithmetic. */
function exactlyWithin(whole: string, fraction: string, unit: Unit, min: number, max: number): boolean {
  const scale = 10n ** BigInt(fraction.length);
  const scaledMs = BigInt(`${whole}${fraction}`) * BigInt(durationUnitMs[unit]);
  return scaledMs >= BigInt(min) * scale && scaledMs <= BigInt(max) * scale;
}

/** Decimal digits of `numerator / denominator` to `digits` places, truncated. */
function decimal(
  numerator: bigint,
  denominator: bigint,
  digits: number,
): { whole: string; fraction: string } {
  const scaled = (numerator * 10n ** BigInt(digits)) / denominator;
  const text = scaled.toString().padStart(digits + 1, '0');
  return { whole: text.slice(0, text.length - digits), fraction: text.slice(text.length - digits) };
}

/** Durations in the grammar, many of them a digit away from a bound in some unit. */
const durationParts = (min: number, max: number) =>
  fc.oneof(
    fc.record({
      whole: fc.stringMatching(/^\d{1,12}$/),
      fraction: fc.oneof(fc.constant(''), fc.stringMatching(/^\d{1,8}$/)),
      unit: fc.constantFrom(...units),
    }),
    fc
      .record({
        bound: fc.constantFrom(min, max),
        unit: fc.constantFrom(...units),
        digits: fc.integer({ min: 0, max: 25 }),
        nudge: fc.integer({ min: -2, max: 2 }),
        zeros: fc.nat({ max: 3 }),
      })
      .map(({ bound, unit, digits, nudge, zeros }) => {
        const near = decimal(BigInt(bound), BigInt(durationUnitMs[unit]), digits);
        const scaled = BigInt(`${near.whole}${near.fraction}`) + BigInt(nudge);
        const moved = decimal(scaled < 0n ? 0n : scaled, 10n ** BigInt(digits), digits);
        return { whole: `${'0'.repeat(zeros)}${moved.whole}`, fraction: moved.fraction, unit };
      }),
  );

describe('durationPatternWithin', () => {
  for (const [min, max] of [
    [minDurationMs, maxDurationMs],
    [1, maxDurationMs],
    [0, 1_000],
    [1_500, 7 * 86_400_000 + 1],
  ] as const) {
    it(`matches exactly the durations from ${min} to ${max} ms`, () => {
      const pattern = new RegExp(durationPatternWithin(min, max));
      const unicode = new RegExp(durationPatternWithin(min, max), 'u');
      fc.assert(
        fc.property(
          durationParts(min, max),
          fc.constantFrom('', ' ', '\t'),
          ({ whole, fraction, unit }, pad) => {
            const text = `${pad}${whole}${fraction ? `.${fraction}` : ''}${unit}${pad}`;
            const within = exactlyWithin(whole, fraction, unit, min, max);
            expect(pattern.test(text), text).toBe(within);
            expect(unicode.test(text), text).toBe(within);
            if (within) {
              const ms = parseDuration(text);
              expect(ms).toBeGreaterThanOrEqual(min);
              expect(ms).toBeLessThanOrEqual(max);
            }
          },
        ),
        { numRuns: 5_000, seed: 17 },
      );
    });
  }

  it('refuses what is not a duration at all', () => {
    const pattern = new RegExp(durationPatternWithin(minDurationMs, maxDurationMs));
    for (const text of [
      '',
      'h',
      '1',
      '1.h',
      '.5h',
      '1.5',
      '-1h',
      '1e3ms',
      '1 h',
      '1H',
      '1hh',
      '0x10m',
      '١h',
    ]) {
      expect(pattern.test(text), text).toBe(false);
    }
    for (const text of ['1m', '0.5h', '1.5h', '90d', '0012h', ' 8h ', '60000ms', '12.857w']) {
      expect(pattern.test(text), text).toBe(true);
    }
  });

  it('stays linear on long inputs', () => {
    const pattern = new RegExp(durationPatternWithin(minDurationMs, maxDurationMs));
    const long = 200_000;
    // wall time: a coarse bound on a regular expression's running time, not a decision.
    const started = performance.now();
    for (const text of [
      '0'.repeat(long),
      `${'0'.repeat(long)}.${'0'.repeat(long)}w`,
      `12.${'857142'.repeat(long / 6)}x`,
      `0.01${'6'.repeat(long)}x`,
      ' '.repeat(long),
    ]) {
      pattern.test(text);
    }
    expect(performance.now() - started).toBeLessThan(2_000);
  });
});
