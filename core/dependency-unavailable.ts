import { status as grpcStatus } from '@grpc/grpc-js';
import {
  isGrpcServiceError,
  ServiceError,
  WorkflowUpdateRPCTimeoutOrCancelledError,
} from '@temporalio/client';
import { ComputeError } from '../domain/errors.ts';

/** Which store the server could not reach. */
export type Dependency = 'database' | 'temporal';

/** How long a client is told to wait before it tries again, in seconds (`Retry-After`). */
export const dependencyRetryAfterSeconds: Record<Dependency, number> = { database: 1, temporal: 2 };

/** Socket errors of a connection to a server that is down, restarting or unreachable. */
const socketErrorCodes = new Set([
  'ECONNREFUSED',
  'ECONNRESET',
  'ECONNABORTED',
  'EPIPE',
  'ETIMEDOUT',
  'EHOSTUNREACH',
  'ENETUNREACH',
  'EAI_AGAIN',
]);

/**
 * PostgreSQL's SQLSTATEs that mean "the server cannot serve this connection now": class 08
 * (connection exception), 57P01 admin_shutdown, 57P02 crash_shutdown, 57P03 cannot_connect_now
 * (starting up or shutting down), 53300 too_many_connections.
 */
const unavailableSqlStates = new Set([
  '08000',
  '08001',
  '08003',
  '08004',
  '08006',
  '08007',
  '08P01',
  '57P01',
  '57P02',
  '57P03',
  '53300',
]);

/**
 * node-postgres and pg-pool raise these without any code when a connection drops or cannot be
 * opened in time: their exact texts are the only way to recognise them.
 */
const codelessPgConnectionErrors = new Set([
  'Connection terminated',
  'Connection terminated unexpectedly',
  'Connection terminated due to connection timeout',
  'Client has encountered a connection error and is not queryable',
  'timeout exceeded when trying to connect',
]);

/** gRPC statuses of a Temporal frontend that is down or did not answer in time. */
const unavailableGrpcStatuses = new Set<number>([grpcStatus.UNAVAILABLE, grpcStatus.DEADLINE_EXCEEDED]);

function codeOf(error: object): unknown {
  return (error as { code?: unknown }).code;
}

function classifyOne(error: unknown): Dependency | null {
  if (typeof error !== 'object' || error === null) return null;
  // An update whose RPC timed out: the frontend or the workflow's worker did not answer in time.
  if (error instanceof WorkflowUpdateRPCTimeoutOrCancelledError) return 'temporal';
  if (error instanceof ServiceError) {
    const cause = error.cause;
    return isGrpcServiceError(cause) && unavailableGrpcStatuses.has(cause.code) ? 'temporal' : null;
  }
  if (isGrpcServiceError(error)) return unavailableGrpcStatuses.has(error.code) ? 'temporal' : null;
  const code = codeOf(error);
  if (typeof code === 'string') {
    if (unavailableSqlStates.has(code) || socketErrorCodes.has(code)) return 'database';
    return null;
  }
  if (code === undefined && error instanceof Error && codelessPgConnectionErrors.has(error.message)) {
    return 'database';
  }
  return null;
}

/**
 * Which store a thrown error says is unreachable, if any: PostgreSQL connection failures (by
 * SQLSTATE or socket error code; pg's code-less connection errors by their exact text) and a
 * Temporal frontend that is down (gRPC UNAVAILABLE or DEADLINE_EXCEEDED). Follows `cause` and
 * AggregateError's `errors` a few levels deep; null for anything else.
 */
export function unavailableDependency(error: unknown, depth = 0): Dependency | null {
  if (depth > 4 || typeof error !== 'object' || error === null) return null;
  const found = classifyOne(error);
  if (found) return found;
  if (error instanceof ServiceError) return null;
  if (error instanceof AggregateError) {
    for (const inner of error.errors) {
      const dependency = unavailableDependency(inner, depth + 1);
      if (dependency) return dependency;
    }
  }
  return unavailableDependency((error as { cause?: unknown }).cause, depth + 1);
}

/**
 * UNAVAILABLE (HTTP 503 with `Retry-After`, retryable) for an error that says PostgreSQL or
 * Temporal cannot be reached; null for anything else.
 */
export function asUnavailable(error: unknown): ComputeError | null {
  const dependency = unavailableDependency(error);
  if (!dependency) return null;
  const what = dependency === 'database' ? 'the database' : 'the workflow service (Temporal)';
  return new ComputeError(
    'UNAVAILABLE',
    `${what} cannot be reached right now; nothing is wrong with the request: retry it (with the same idempotency key)`,
    { dependency, retryAfterSeconds: dependencyRetryAfterSeconds[dependency] },
  );
}
