import { CommanderError } from 'commander';
import { ComputeClientError, ComputeConnectionError } from '../client/index.ts';
import { assertNever, type ErrorCode, isComputeError } from '../domain/errors.ts';

/**
 * Exit statuses by error class, so scripts can tell what went wrong without reading the text.
 * Documented in README ("CLI").
 */
export const exitCodes = {
  ok: 0,
  /** A bug or an INTERNAL answer: report it with the request id. */
  internal: 1,
  /** A wrong flag or argument, a malformed duration or date, an unreadable file, INVALID_INPUT. */
  usage: 2,
  /** The API refused: a code other than INVALID_INPUT, UNAUTHENTICATED or INTERNAL. */
  refused: 3,
  /**
   * The API could not be reached (or something else answered at that URL), or it answered
   * UNAVAILABLE (its database or Temporal is down) after the retries: try again later.
   */
  connection: 4,
  /** No credential, or the API did not accept it (UNAUTHENTICATED). */
  credential: 5,
  /** A wait (`reservations watch --timeout`) ran out before what it waited for happened. */
  timeout: 6,
} as const;

/** An error of the CLI's own, already phrased for people, with its exit status. */
export class CliError extends Error {
  override readonly name = 'CliError';
  constructor(
    message: string,
    readonly exitCode: number = exitCodes.usage,
  ) {
    super(message);
  }
}

/** What to do next, per refusal code. */
const nextStep: Record<ErrorCode, string> = {
  INVALID_INPUT: 'fix the value named above and run it again',
  UNAUTHENTICATED: 'pass a valid token with --token or BETTER_COMPUTE_TOKEN',
  ACCESS_DENIED: 'ask an administrator of the tenant for the permission, or use a token that has it',
  NOT_FOUND: 'check the id and the --tenant (list what exists with the matching list command)',
  CONFLICT: 'run it again with a new --key, or read the existing object named above',
  QUOTA_EXCEEDED:
    'ask for fewer resources, release a reservation, or ask for more quota; the same --key retries',
  CAPACITY_UNAVAILABLE: 'try a smaller request, another --pool, or later (see `better-compute capacity`)',
  INVALID_STATE: 'read its current state with `reservations get` and pick a command that applies to it',
  UNSUPPORTED: 'this server does not offer that; see the README for what it supports',
  CONFIRMATION_REQUIRED:
    'the person you act for must approve it (`confirmations approve ID`); then retry with the same --key',
  SPEND_LIMIT_REACHED:
    'the budget is spent for this period; raise it or wait for the next window, then retry with the same --key',
  RATE_LIMITED: 'wait a moment and run it again',
  UNAVAILABLE:
    'the server cannot reach its database or Temporal right now; run it again in a moment (the same --key is safe)',
  INTERNAL: 'run it again; if it persists, report the request id to the operators',
};

function classOf(code: ErrorCode): number {
  switch (code) {
    case 'INVALID_INPUT':
      return exitCodes.usage;
    case 'UNAUTHENTICATED':
      return exitCodes.credential;
    case 'INTERNAL':
      return exitCodes.internal;
    case 'UNAVAILABLE':
      return exitCodes.connection;
    case 'ACCESS_DENIED':
    case 'NOT_FOUND':
    case 'CONFLICT':
    case 'QUOTA_EXCEEDED':
    case 'CAPACITY_UNAVAILABLE':
    case 'INVALID_STATE':
    case 'UNSUPPORTED':
    case 'CONFIRMATION_REQUIRED':
    case 'SPEND_LIMIT_REACHED':
    case 'RATE_LIMITED':
      return exitCodes.refused;
    default:
      return assertNever(code);
  }
}

/** One line for people and the exit status, for anything a command can throw. */
export function describeError(error: unknown): {
  line: string;
  exitCode: number;
  json: Record<string, unknown>;
} {
  if (error instanceof CliError) {
    return { line: error.message, exitCode: error.exitCode, json: { code: 'USAGE', message: error.message } };
  }
  if (error instanceof ComputeClientError) {
    const details = error.details ? ` ${JSON.stringify(error.details)}` : '';
    const request = error.requestId ? ` [request ${error.requestId}]` : '';
    return {
      line: `${error.code}: ${error.message}${details}. Next: ${nextStep[error.code]}.${request}`,
      exitCode: classOf(error.code),
      json: {
        code: error.code,
        message: error.message,
        ...(error.details ? { details: error.details } : {}),
        requestId: error.requestId ?? null,
        next: nextStep[error.code],
      },
    };
  }
  if (error instanceof ComputeConnectionError) {
    const line = `${error.message}. Next: start the API (\`npm run dev\`) or point --url / BETTER_COMPUTE_URL at it.`;
    return { line, exitCode: exitCodes.connection, json: { code: 'CONNECTION', message: error.message } };
  }
  if (isComputeError(error)) {
    // A local validation (a duration, a date) phrased by domain code.
    return {
      line: `${error.code}: ${error.message}`,
      exitCode: classOf(error.code),
      json: { code: error.code, message: error.message },
    };
  }
  if (error instanceof CommanderError) {
    return {
      line: error.message,
      exitCode: exitCodes.usage,
      json: { code: 'USAGE', message: error.message },
    };
  }
  const message = error instanceof Error ? error.message : String(error);
  return {
    line: `unexpected error: ${message} (this is a bug; please report it)`,
    exitCode: exitCodes.internal,
    json: { code: 'INTERNAL', message },
  };
}
