/**
 * The one closed set of error codes (DESIGN.md principle 8) and the one table mapping each code to
 * its HTTP status, its gRPC status and whether Temporal may retry an activity that failed with it.
 * Errors are told apart by `code`, never by message text.
 */
export const errorCodes = [
  'INVALID_INPUT',
  'UNAUTHENTICATED',
  'ACCESS_DENIED',
  'NOT_FOUND',
  'CONFLICT',
  'QUOTA_EXCEEDED',
  'CAPACITY_UNAVAILABLE',
  'INVALID_STATE',
  'UNSUPPORTED',
  'CONFIRMATION_REQUIRED',
  'SPEND_LIMIT_REACHED',
  'RATE_LIMITED',
  'UNAVAILABLE',
  'INTERNAL',
] as const;

export type ErrorCode = (typeof errorCodes)[number];

/** gRPC status codes by name, as numbered in the gRPC specification. */
export const grpcStatus = {
  OK: 0,
  INVALID_ARGUMENT: 3,
  NOT_FOUND: 5,
  ALREADY_EXISTS: 6,
  PERMISSION_DENIED: 7,
  RESOURCE_EXHAUSTED: 8,
  FAILED_PRECONDITION: 9,
  ABORTED: 10,
  UNIMPLEMENTED: 12,
  INTERNAL: 13,
  UNAVAILABLE: 14,
  UNAUTHENTICATED: 16,
} as const;

interface ErrorCodeTraits {
  httpStatus: number;
  grpcStatus: number;
  /** Whether a Temporal activity failing with this code should be retried. */
  retryable: boolean;
}

export const errorCodeTraits: Record<ErrorCode, ErrorCodeTraits> = {
  INVALID_INPUT: { httpStatus: 400, grpcStatus: grpcStatus.INVALID_ARGUMENT, retryable: false },
  UNAUTHENTICATED: { httpStatus: 401, grpcStatus: grpcStatus.UNAUTHENTICATED, retryable: false },
  ACCESS_DENIED: { httpStatus: 403, grpcStatus: grpcStatus.PERMISSION_DENIED, retryable: false },
  NOT_FOUND: { httpStatus: 404, grpcStatus: grpcStatus.NOT_FOUND, retryable: false },
  CONFLICT: { httpStatus: 409, grpcStatus: grpcStatus.ABORTED, retryable: false },
  QUOTA_EXCEEDED: { httpStatus: 429, grpcStatus: grpcStatus.RESOURCE_EXHAUSTED, retryable: false },
  CAPACITY_UNAVAILABLE: { httpStatus: 503, grpcStatus: grpcStatus.RESOURCE_EXHAUSTED, retryable: false },
  INVALID_STATE: { httpStatus: 409, grpcStatus: grpcStatus.FAILED_PRECONDITION, retryable: false },
  // 422, not 501: the request is well-formed and understood but asks for something this server
  // does not offer; a 5xx would tell clients the server failed and invite retries.
  UNSUPPORTED: { httpStatus: 422, grpcStatus: grpcStatus.UNIMPLEMENTED, retryable: false },
  CONFIRMATION_REQUIRED: { httpStatus: 403, grpcStatus: grpcStatus.PERMISSION_DENIED, retryable: false },
  SPEND_LIMIT_REACHED: { httpStatus: 402, grpcStatus: grpcStatus.RESOURCE_EXHAUSTED, retryable: false },
  RATE_LIMITED: { httpStatus: 429, grpcStatus: grpcStatus.RESOURCE_EXHAUSTED, retryable: true },
  // A store the server depends on (PostgreSQL, Temporal) cannot be reached right now: nothing is
  // wrong with the request, so clients retry after `details.retryAfterSeconds` (also `Retry-After`).
  UNAVAILABLE: { httpStatus: 503, grpcStatus: grpcStatus.UNAVAILABLE, retryable: true },
  INTERNAL: { httpStatus: 500, grpcStatus: grpcStatus.INTERNAL, retryable: true },
};

export type ErrorDetails = Record<string, unknown>;

/** The typed error every layer throws; the API envelope, gRPC and Temporal translate it by `code`. */
export class ComputeError extends Error {
  override readonly name = 'ComputeError';
  constructor(
    readonly code: ErrorCode,
    message: string,
    readonly details?: ErrorDetails,
  ) {
    super(message);
  }
}

export function isComputeError(value: unknown): value is ComputeError {
  return value instanceof ComputeError;
}

export function isErrorCode(value: unknown): value is ErrorCode {
  return typeof value === 'string' && (errorCodes as readonly string[]).includes(value);
}

/** Exhaustiveness guard for switches over closed unions. */
export function assertNever(value: never): never {
  throw new ComputeError('INTERNAL', `unexpected value ${JSON.stringify(value)}`);
}
