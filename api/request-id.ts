import type { MiddlewareHandler } from 'hono';
import { newId } from '../domain/ids.ts';
import type { ApiEnv } from './env.ts';

/** What a client may send as `x-request-id`: 1 to 128 of `A-Z a-z 0-9 . _ : -`. */
export const clientRequestIdPattern = /^[A-Za-z0-9._:-]{1,128}$/;

/** The client's request id when it is well-formed, else a fresh `req_…` id. */
export function acceptRequestId(header: string | undefined): string {
  return header !== undefined && clientRequestIdPattern.test(header) ? header : newId('req');
}

/**
 * Sets the call's request id (logged, written to audit rows, answered in every error envelope)
 * and answers it in the `x-request-id` header. A malformed client id is ignored, not refused: the
 * answer's header carries the fresh id the server used instead.
 */
export function requestIdMiddleware(): MiddlewareHandler<ApiEnv> {
  return async (c, next) => {
    const requestId = acceptRequestId(c.req.header('x-request-id'));
    c.set('requestId', requestId);
    c.header('x-request-id', requestId);
    await next();
  };
}
