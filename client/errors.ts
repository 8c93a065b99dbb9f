import type { ErrorCode } from '../domain/errors.ts';

/**
 * The API answered with its `{ error }` envelope: `code` is one of the closed set of error codes
 * (never tell errors apart by `message`), `details` carries what the code documents
 * (`reservationId` on CONFLICT, `confirmationId` on CONFIRMATION_REQUIRED, …).
 */
export class ComputeClientError extends Error {
  override readonly name = 'ComputeClientError';
  readonly code: ErrorCode;
  readonly status: number;
  readonly details: Record<string, unknown> | undefined;
  readonly requestId: string | undefined;
  /** `group.method` of the call that failed. */
  readonly method: string;

  constructor(init: {
    code: ErrorCode;
    message: string;
    status: number;
    details?: Record<string, unknown> | undefined;
    requestId?: string | undefined;
    method: string;
  }) {
    super(init.message);
    this.code = init.code;
    this.status = init.status;
    this.details = init.details;
    this.requestId = init.requestId;
    this.method = init.method;
  }
}

/**
 * The call never got an answer from the API: the URL is unreachable, the connection dropped, or
 * something other than the API (a proxy, a wrong port) answered without the envelope.
 */
export class ComputeConnectionError extends Error {
  override readonly name = 'ComputeConnectionError';
  readonly url: string;
  readonly status: number | undefined;

  constructor(message: string, init: { url: string; status?: number; cause?: unknown }) {
    super(message, init.cause === undefined ? undefined : { cause: init.cause });
    this.url = init.url;
    this.status = init.status;
  }
}

export function isComputeClientError(value: unknown): value is ComputeClientError {
  return value instanceof ComputeClientError;
}
