import { ComputeError } from './errors.ts';

export const durationUnitMs = {
  ms: 1,
  s: 1_000,
  m: 60_000,
  h: 3_600_000,
  d: 86_400_000,
  w: 604_800_000,
} as const;
const unitMs = durationUnitMs;
const durationPattern = /^(\d+(?:\.\d+)?)(ms|s|m|h|d|w)$/;

/**
 * Parses a duration given as milliseconds (a non-negative integer) or a string such as `8h`,
 * `90m`, `1.5h` or `28800000ms` into whole milliseconds. Throws INVALID_INPUT naming `field`.
 */
export function parseDuration(value: string | number, field = 'duration'): number {
  if (typeof value === 'number') {
    if (!Number.isSafeInteger(value) || value < 0) {
      throw new ComputeError(
        'INVALID_INPUT',
        `${field} must be a whole number of milliseconds, got ${value}`,
      );
    }
    return value;
  }
  const match = durationPattern.exec(value.trim());
  if (!match) {
    throw new ComputeError(
      'INVALID_INPUT',
      `${field} must be a duration such as '8h', '90m', '2d' or milliseconds, got '${value}'`,
    );
  }
  const ms = Math.round(Number(match[1]) * unitMs[match[2] as keyof typeof unitMs]);
  if (!Number.isSafeInteger(ms)) throw new ComputeError('INVALID_INPUT', `${field} is too long: '${value}'`);
  return ms;
}

/** Formats milliseconds for people: `8h`, `1h30m`, `45s`. */
export function formatDuration(ms: number): string {
  if (ms === 0) return '0s';
  const parts: string[] = [];
  let rest = Math.abs(ms);
  for (const [unit, size] of [
    ['d', unitMs.d],
    ['h', unitMs.h],
    ['m', unitMs.m],
    ['s', unitMs.s],
  ] as const) {
    if (rest >= size) {
      parts.push(`${Math.floor(rest / size)}${unit}`);
      rest %= size;
    }
  }
  if (rest > 0 || parts.length === 0) parts.push(`${rest}ms`);
  return (ms < 0 ? '-' : '') + parts.join('');
}

// ---------------------------------------------------------------------------------------------
// The duration grammar as a regular expression bounded by value, so that a JSON Schema (OpenAPI)
// states the bounds exactly: a string matches when its number times its unit lies within them.

type Digits = number[];

/** The digits of a rational in [0, 1) after the point: a prefix, then a cycle repeated forever ([0] once it ends). */
function fractionDigits(numerator: bigint, denominator: bigint): { prefix: Digits; cycle: Digits } {
  let remainder = numerator % denominator;
  const digits: Digits = [];
  const seen = new Map<bigint, number>();
  while (!seen.has(remainder)) {
    seen.set(remainder, digits.length);
    remainder *= 10n;
    digits.push(Number(remainder / denominator));
    remainder %= denominator;
  }
  const start = seen.get(remainder)!;
  return { prefix: digits.slice(0, start), cycle: digits.slice(start) };
}

function alternatives(parts: Array<string | null>, optional = false): string | null {
  const present = parts.filter((p): p is string => p !== null);
  if (present.length === 0) return optional ? '' : null;
  const body = present.length === 1 ? present[0]! : present.join('|');
  if (optional) return `(?:${body})?`;
  return present.length === 1 ? body : `(?:${body})`;
}

function digitRange(from: number, to: number): string {
  return from === to ? String(from) : `[${from}-${to}]`;
}

/**
 * The fraction digits F (one at least) with 0.F ≥ the expansion (`side` above) or ≤ it (below),
 * read as an automaton over the expansion: a digit beyond the bound's ends the comparison either
 * way, an equal digit moves on, and F ending means the rest of F is zeros.
 */
function fractionPattern(expansion: { prefix: Digits; cycle: Digits }, side: 'above' | 'below'): string {
  let { prefix, cycle } = expansion;
  if (cycle.every((d) => d === 0)) cycle = [0];
  // The first digit must not be an end (F is not empty): give it a state of its own.
  if (prefix.length === 0) {
    prefix = [cycle[0]!];
    cycle = [...cycle.slice(1), cycle[0]!];
  }
  const zerosFrom = (i: number) => prefix.slice(i).every((d) => d === 0) && cycle.every((d) => d === 0);
  // Inclusive on both sides: equal to the bound (F, then zeros, is the expansion) is within.
  const endAt = (i: number) => (side === 'above' ? zerosFrom(i) : true);
  const leave = (d: number) =>
    side === 'above'
      ? d === 9
        ? null
        : `${digitRange(d + 1, 9)}\\d*`
      : d === 0
        ? null
        : `${digitRange(0, d - 1)}\\d*`;
  const cycleEndAt = endAt(prefix.length);
  const cycleExit = (j: number): string | null => {
    const next = j < cycle.length - 1 ? cycleExit(j + 1) : null;
    return alternatives([leave(cycle[j]!), next === null ? null : `${cycle[j]}${next}`], cycleEndAt);
  };
  const exitAfterCycles = cycleExit(0);
  const loop = `(?:${cycle.join('')})*`;
  const fromCycle = exitAfterCycles === null ? null : `${loop}${exitAfterCycles}`;
  const state = (i: number): string | null => {
    if (i === prefix.length) return fromCycle;
    const next = state(i + 1);
    return alternatives([leave(prefix[i]!), next === null ? null : `${prefix[i]}${next}`], i > 0 && endAt(i));
  };
  const pattern = state(0);
  if (pattern === null) throw new Error('fractionPattern: no fraction lies within the bound');
  return pattern;
}

function sameLengthRange(low: string, high: string): string {
  if (low.length === 1) return digitRange(Number(low), Number(high));
  if (low[0] === high[0]) return `${low[0]}${wrap(sameLengthRange(low.slice(1), high.slice(1)))}`;
  const rest = low.length - 1;
  const parts: string[] = [];
  let first = Number(low[0]);
  let last = Number(high[0]);
  if (low.slice(1) !== '0'.repeat(rest)) {
    parts.push(`${low[0]}${wrap(sameLengthRange(low.slice(1), '9'.repeat(rest)))}`);
    first++;
  }
  const highTail = high.slice(1) !== '9'.repeat(rest);
  if (highTail) last--;
  if (first <= last) parts.push(`${digitRange(first, last)}${rest === 1 ? '\\d' : `\\d{${rest}}`}`);
  if (highTail) parts.push(`${high[0]}${wrap(sameLengthRange('0'.repeat(rest), high.slice(1)))}`);
  return alternatives(parts)!;
}

function wrap(pattern: string): string {
  return /^[\d\\]|^\[|^\(/.test(pattern) && !pattern.includes('|') ? pattern : `(?:${pattern})`;
}

/** Whole numbers from `low` to `high` (low ≥ 1) written without leading zeros. */
function integerRange(low: bigint, high: bigint): string {
  const parts: string[] = [];
  for (let length = String(low).length; length <= String(high).length; length++) {
    const from = low > 10n ** BigInt(length - 1) ? low : 10n ** BigInt(length - 1);
    const to = high < 10n ** BigInt(length) - 1n ? high : 10n ** BigInt(length) - 1n;
    if (from <= to) parts.push(sameLengthRange(String(from), String(to)));
  }
  return alternatives(parts)!;
}

/** A whole number part equal to `n`, leading zeros allowed (the grammar's `\d+`). */
function integerEqual(n: bigint): string {
  return n === 0n ? '0+' : `0*${n}`;
}

/** A whole number part from `low` to `high`, leading zeros allowed. */
function integerBetween(low: bigint, high: bigint): string {
  if (low > 0n) return `0*${wrap(integerRange(low, high))}`;
  return high === 0n ? '0+' : `(?:0+|0*${wrap(integerRange(1n, high))})`;
}

/** Decimal numbers (`\d+(\.\d+)?`) from `low / denominator` to `high / denominator`, both included. */
function decimalBetween(low: bigint, high: bigint, denominator: bigint): string | null {
  if (low > high) return null;
  const whole = { low: low / denominator, high: high / denominator };
  const below = `(?:\\.${fractionPattern(fractionDigits(high, denominator), 'below')})?`;
  if (whole.low === whole.high) {
    if (low % denominator === 0n) return `${integerEqual(whole.high)}${below}`;
    // Two fractional bounds within one whole number: no duration bound needs it.
    throw new Error('decimalBetween: two fractional bounds with the same whole part are not supported');
  }
  const parts: string[] = [];
  parts.push(
    low % denominator === 0n
      ? `${integerEqual(whole.low)}(?:\\.\\d+)?`
      : `${integerEqual(whole.low)}\\.${fractionPattern(fractionDigits(low, denominator), 'above')}`,
  );
  if (whole.low + 1n <= whole.high - 1n) {
    parts.push(`${integerBetween(whole.low + 1n, whole.high - 1n)}(?:\\.\\d+)?`);
  }
  parts.push(`${integerEqual(whole.high)}${below}`);
  return alternatives(parts);
}

/**
 * The source of a regular expression (no flags needed, valid in JSON Schema) matching exactly the
 * duration strings `parseDuration` reads whose value, the number times its unit taken exactly (no
 * rounding), lies within [`minMs`, `maxMs`]: so `'1m'`, `'0.5h'` and `'90d'` for 1m to 90d, not
 * `'0ms'` or `'91d'`. Surrounding white space is allowed, as `parseDuration` trims it.
 */
export function durationPatternWithin(minMs: number, maxMs: number): string {
  if (!(Number.isSafeInteger(minMs) && Number.isSafeInteger(maxMs) && minMs >= 0 && minMs <= maxMs)) {
    throw new Error(`durationPatternWithin: need whole milliseconds 0 <= min <= max, got ${minMs}, ${maxMs}`);
  }
  const units: string[] = [];
  for (const [unit, size] of Object.entries(durationUnitMs)) {
    const number = decimalBetween(BigInt(minMs), BigInt(maxMs), BigInt(size));
    if (number !== null) units.push(`${wrap(number)}${unit}`);
  }
  return `^\\s*(?:${units.join('|')})\\s*$`;
}
