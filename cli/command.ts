import { type Command, CommanderError, InvalidArgumentError, Option } from 'commander';
import type { ComputeClient } from '../client/index.ts';
import { parseDuration } from '../domain/duration.ts';
import { isComputeError } from '../domain/errors.ts';
import { type ConnectionOptions, clientFor } from './context.ts';
import { describeError, exitCodes } from './errors.ts';
import { createPrinter, type Printer } from './output.ts';

/** What an API command's action receives. */
export interface CommandContext<O> {
  options: O & ConnectionOptions;
  client: ComputeClient;
  out: Printer;
}

/** Adds --url, --token and --json to a command that calls the API. */
export function withConnection(command: Command): Command {
  return command
    .option('--url <url>', 'API URL (default: BETTER_COMPUTE_URL, or the dev stack’s .data/dev.json)')
    .option('--token <token>', 'API token (default: BETTER_COMPUTE_TOKEN, or the dev stack’s)')
    .option('--json', 'print the result as JSON, for scripts');
}

/** Prints a failure as one line (or a JSON error with --json) and sets the exit status. */
export function fail(error: unknown, json: boolean): void {
  const described = describeError(error);
  if (json) process.stdout.write(`${JSON.stringify({ error: described.json }, null, 2)}\n`);
  process.stderr.write(`better-compute: ${described.line}\n`);
  process.exitCode = described.exitCode;
}

/**
 * Wraps an API command's action: builds the client from the options, runs it, and turns any
 * failure into one line and its exit status (never a stack trace).
 */
export function apiAction<O>(run: (ctx: CommandContext<O>, ...args: string[]) => Promise<void>) {
  return async (...args: unknown[]) => {
    const command = args.at(-1) as Command;
    const options = command.opts() as O & ConnectionOptions;
    const positional = args.slice(0, -2) as string[];
    try {
      const client = clientFor(options);
      await run({ options, client, out: createPrinter(options) }, ...positional);
    } catch (error) {
      fail(error, options.json === true);
    }
  };
}

/** Option parsers: a bad value is a usage error naming the flag, caught by commander. */
export const parse = {
  duration(value: string): number {
    try {
      return parseDuration(value, 'the duration');
    } catch (error) {
      throw new InvalidArgumentError(isComputeError(error) ? error.message : String(error));
    }
  },
  positiveInt(value: string): number {
    if (!/^\d+$/.test(value) || Number(value) < 1)
      throw new InvalidArgumentError(`expected a whole number ≥ 1, got '${value}'`);
    return Number(value);
  },
  nonNegativeNumber(value: string): number {
    const n = Number(value);
    if (value.trim() === '' || !Number.isFinite(n) || n < 0)
      throw new InvalidArgumentError(`expected a number ≥ 0, got '${value}'`);
    return n;
  },
  /**
   * An instant: an ISO date-time (`2026-12-01T09:00:00Z`), epoch milliseconds, `now`, or `+8h`
   * (relative to now). Answers epoch milliseconds.
   */
  instant(value: string): number {
    const v = value.trim();
    if (v === 'now') return Date.now();
    if (v.startsWith('+')) {
      try {
        return Date.now() + parseDuration(v.slice(1), 'the offset');
      } catch (error) {
        throw new InvalidArgumentError(isComputeError(error) ? error.message : String(error));
      }
    }
    if (/^\d{10,}$/.test(v)) return Number(v);
    if (/^\d{4}-\d{2}-\d{2}/.test(v)) {
      const ms = Date.parse(v);
      if (!Number.isNaN(ms)) return ms;
    }
    throw new InvalidArgumentError(
      `expected a date such as 2026-12-01T09:00:00Z, epoch milliseconds, 'now' or '+8h', got '${value}'`,
    );
  },
};

/** A required option that is still a usage error (exit 2) when missing. */
export function required(flags: string, description: string): Option {
  return new Option(flags, description).makeOptionMandatory();
}

/**
 * Makes commander's own usage errors (unknown option or command, missing argument, bad value, a
 * group run without its subcommand) exit with the usage status, and --help exit 0, for `command`
 * and every command below it.
 */
export function usageExits(command: Command): void {
  const handler = (error: CommanderError) => {
    // --help and --version exit 0; help shown because a command is missing is a usage error.
    process.exit(error.exitCode === 0 ? exitCodes.ok : exitCodes.usage);
  };
  const visit = (c: Command) => {
    c.exitOverride(handler);
    for (const sub of c.commands) visit(sub);
  };
  visit(command);
}

export { CommanderError };
