import { formatDuration } from '../domain/duration.ts';

export interface Column<T> {
  header: string;
  value(row: T): string | number | boolean | null | undefined;
  /** Right-align (numbers). */
  right?: boolean;
}

function cell(value: string | number | boolean | null | undefined): string {
  if (value === null || value === undefined || value === '') return '-';
  if (typeof value === 'boolean') return value ? 'yes' : 'no';
  return String(value);
}

/** A plain text table: a header row, then one row per item, columns padded to fit. */
export function renderTable<T>(rows: readonly T[], columns: ReadonlyArray<Column<T>>): string {
  const cells = rows.map((row) => columns.map((c) => cell(c.value(row))));
  const widths = columns.map((c, i) => Math.max(c.header.length, ...cells.map((r) => r[i]!.length)));
  const line = (values: string[]) =>
    values
      .map((v, i) => (columns[i]!.right ? v.padStart(widths[i]!) : v.padEnd(widths[i]!)))
      .join('  ')
      .trimEnd();
  return [line(columns.map((c) => c.header)), ...cells.map(line)].join('\n');
}

/** `key: value` lines, aligned, for one object. */
export function renderFields(
  fields: ReadonlyArray<[string, string | number | boolean | null | undefined]>,
): string {
  const width = Math.max(...fields.map(([k]) => k.length));
  return fields.map(([k, v]) => `${`${k}:`.padEnd(width + 1)} ${cell(v)}`).join('\n');
}

/** Epoch milliseconds as an ISO instant without milliseconds, for people. */
export function formatTime(ms: number | null | undefined): string | null {
  if (ms === null || ms === undefined) return null;
  return new Date(ms).toISOString().replace(/\.\d{3}Z$/, 'Z');
}

/** How long ago `ms` was, relative to `now`: `12s ago`, `3h4m ago`. */
export function formatAge(ms: number | null | undefined, now = Date.now()): string | null {
  if (ms === null || ms === undefined) return null;
  return `${formatDuration(Math.max(0, Math.round((now - ms) / 1000) * 1000))} ago`;
}

export interface Printer {
  json: boolean;
  /** The result: as JSON with --json, else as `human` renders it. */
  result<T>(value: T, human: (value: T) => string): void;
  /** Progress for people, on stderr (never in --json output). */
  progress(line: string): void;
}

export function createPrinter(options: { json?: boolean }): Printer {
  const json = options.json === true;
  return {
    json,
    result(value, human) {
      process.stdout.write(`${json ? JSON.stringify(value, null, 2) : human(value)}\n`);
    },
    progress(line) {
      if (!json) process.stderr.write(`${line}\n`);
    },
  };
}
