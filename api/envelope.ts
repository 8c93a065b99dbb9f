import { asUnavailable } from '../core/dependency-unavailable.ts';
import type { Logger } from '../core/logger.ts';
import { isTransientConflict } from '../db/conflict-retry.ts';
import { ComputeError, type ErrorCode, errorCodeTraits } from '../domain/errors.ts';

export interface ErrorBody {
  error: { code: ErrorCode; message: string; details?: Record<string, unknown>; requestId: string };
}

/**
 * Any thrown value as a ComputeError: PostgreSQL or Temporal out of reach is UNAVAILABLE (503 with
 * `Retry-After`, logged as a warning), and so is a transaction PostgreSQL rolled back whole to break
 * a deadlock or a serialization conflict (nothing of it was kept: the same call again is safe);
 * other unexpected ones become INTERNAL and are logged in full.
 */
export function toComputeError(error: unknown, log: Logger): ComputeError {
  if (error instanceof ComputeError) return error;
  const unavailable = asUnavailable(error);
  if (unavailable) {
    // One line, no stack: during an outage every request lands here.
    const cause = error instanceof Error ? error.message : String(error);
    log.warn({ dependency: unavailable.details?.dependency, cause }, 'answered UNAVAILABLE');
    return unavailable;
  }
  if (isTransientConflict(error)) {
    log.warn({ cause: error instanceof Error ? error.message : String(error) }, 'answered UNAVAILABLE');
    return new ComputeError(
      'UNAVAILABLE',
      'the database rolled this call back to break a conflict with another (nothing of it was kept): retry it (with the same idempotency key)',
      { dependency: 'database', conflict: true, retryAfterSeconds: 1 },
    );
  }
  log.error({ err: error }, 'unexpected error');
  return new ComputeError('INTERNAL', 'internal error: the server logged the cause under this request id');
}

/**
 * The `{ error }` envelope, its HTTP status from the one table of codes, and its headers: a
 * `Retry-After` (whole seconds) when the error says how long to wait (`details.retryAfterSeconds`).
 */
export function errorEnvelope(
  error: ComputeError,
  requestId: string,
): { status: number; body: ErrorBody; headers: Record<string, string> } {
  const retryAfter = error.details?.retryAfterSeconds;
  return {
    status: errorCodeTraits[error.code].httpStatus,
    headers:
      typeof retryAfter === 'number' && Number.isFinite(retryAfter) && retryAfter >= 0
        ? { 'Retry-After': String(Math.ceil(retryAfter)) }
        : {},
    body: {
      error: {
        code: error.code,
        message: error.message,
        ...(error.details ? { details: error.details } : {}),
        requestId,
      },
    },
  };
}
