import { ComputeError } from './errors.ts';

const unitMs = { ms: 1, s: 1_000, m: 60_000, h: 3_600_000, d: 86_400_000, w: 604_800_000 } as const;
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
