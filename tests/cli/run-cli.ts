import { execFile } from 'node:child_process';
import path from 'node:path';
import { inject } from 'vitest';

const bin = path.resolve(import.meta.dirname, '../../bin/better-compute.js');
// An empty data directory, so a developer's own .data/dev.json never leaks into a test (the
// suite's setup makes it and removes it at the end).
const emptyDataDir = inject('cliDataDir');

export interface CliResult {
  code: number;
  stdout: string;
  stderr: string;
}

/** Runs the real `better-compute` binary in a child process and collects what it printed. */
export function runCli(args: string[], env: Record<string, string | undefined> = {}): Promise<CliResult> {
  return new Promise((resolve) => {
    execFile(
      process.execPath,
      [bin, ...args],
      {
        env: {
          PATH: process.env.PATH,
          HOME: process.env.HOME,
          BETTER_COMPUTE_DATA_DIR: emptyDataDir,
          ...env,
        },
        timeout: 60_000,
      },
      (error, stdout, stderr) => {
        const code = error ? (typeof error.code === 'number' ? error.code : 1) : 0;
        resolve({ code, stdout, stderr });
      },
    );
  });
}

/** The stdout of a successful `--json` run, parsed; fails loudly with stderr otherwise. */
export function json<T = any>(result: CliResult): T {
  if (result.code !== 0) throw new Error(`exit ${result.code}: ${result.stderr}`);
  return JSON.parse(result.stdout) as T;
}
