import { readdirSync, readFileSync } from 'node:fs';
import { join, relative } from 'node:path';
import { describe, expect, it } from 'vitest';

const repo = join(import.meta.dirname, '..', '..');

/** The folders whose code decides things: they read the one clock, `compute_now()`. */
const decisionFolders = ['api', 'db', 'activities', 'gateway', 'core'];

const wallClock = /\bDate\.now\(\)|\bnew Date\(\s*\)/;
/** A use that really is wall time (a wait, a timer, a TTL) says so, with the reason. */
const wallTimeMark = /\/\/ wall time: \S/;
const commentLine = /^\s*(\/\/|\/\*|\*)/;

function sourceFiles(dir: string): string[] {
  return readdirSync(dir, { withFileTypes: true }).flatMap((entry) => {
    const path = join(dir, entry.name);
    if (entry.isDirectory()) return sourceFiles(path);
    return entry.name.endsWith('.ts') && !entry.name.endsWith('.test.ts') ? [path] : [];
  });
}

/** Every `file:line: text` in `files` that reads the wall clock without saying why. */
function unmarkedWallClockReads(files: Array<{ path: string; text: string }>): string[] {
  return files.flatMap(({ path, text }) => {
    const lines = text.split('\n');
    return lines.flatMap((line, i) => {
      if (commentLine.test(line) || !wallClock.test(line)) return [];
      if (wallTimeMark.test(line) || wallTimeMark.test(lines[i - 1] ?? '')) return [];
      return [`${path}:${i + 1}: ${line.trim()}`];
    });
  });
}

describe('one clock in every decision path', () => {
  it('finds unmarked reads, and accepts marked ones', () => {
    const found = unmarkedWallClockReads([
      {
        path: 'x.ts',
        text: [
          'const a = Date.now();',
          'const b = new Date();',
          'const c = new Date(row.at);',
          '// wall time: a poll deadline',
          'const d = Date.now() + 5_000;',
          'while (Date.now() < d) {} // wall time: the same poll',
          '/** Never Date.now() here. */',
          '// wall time:',
          'const e = Date.now();',
        ].join('\n'),
      },
    ]);
    expect(found).toEqual([
      'x.ts:1: const a = Date.now();',
      'x.ts:2: const b = new Date();',
      'x.ts:9: const e = Date.now();',
    ]);
  });

  it(`no bare Date.now() or new Date() in ${decisionFolders.join('/, ')}/ (mark waits and TTLs "// wall time: <why>")`, () => {
    const files = decisionFolders.flatMap((folder) =>
      sourceFiles(join(repo, folder)).map((path) => ({
        path: relative(repo, path),
        text: readFileSync(path, 'utf8'),
      })),
    );
    expect(unmarkedWallClockReads(files)).toEqual([]);
  });
});
