import type { Logger } from '../core/logger.ts';
import { ComputeError, type ErrorCode, errorCodeTraits } from '../domain/errors.ts';

export interface ErrorBody {
  error: { code: ErrorCode; message: string; details?: Record<string, unknown>; requestId: string };
}

/** Any thrown value as a ComputeError; unexpected ones become INTERNAL and are logged in full. */
export function toComputeError(error: unknown, log: Logger): ComputeError {
  if (error instanceof ComputeError) return error;
  log.error({ err: error }, 'unexpected error');
  return new ComputeError('INTERNAL', 'internal error: the server logged the cause under this request id');
}

/** The `{ error }` envelope and its HTTP status, from the one table of codes. */
export function errorEnvelope(error: ComputeError, requestId: string): { status: number; body: ErrorBody } {
  return {
    status: errorCodeTraits[error.code].httpStatus,
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
