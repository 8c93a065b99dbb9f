import type { Context, MiddlewareHandler } from 'hono';
import { bodyLimit } from 'hono/body-limit';
import { ComputeError } from '../domain/errors.ts';
import type { ApiEnv } from './env.ts';

/** The largest request body a method call may send: 1 MiB. */
export const maxRequestBodyBytes = 1024 * 1024;

function describeBytes(bytes: number): string {
  return bytes % (1024 * 1024) === 0 ? `${bytes / (1024 * 1024)} MiB (${bytes} bytes)` : `${bytes} bytes`;
}

/**
 * Refuses a body larger than `maxBytes` before anything reads it whole: by its Content-Length
 * when it has one, else while it streams in. INVALID_INPUT with `details.limitBytes`.
 *
 * A body with a Content-Length is judged by the header alone, here: hono's bodyLimit would first
 * ask for the request's `body`, and on Node that builds the whole WHATWG Request and its stream
 * for every call (the adapter's direct read of the body is then lost). Only a streamed body goes
 * through bodyLimit.
 */
export function requestBodyLimit(maxBytes = maxRequestBodyBytes): MiddlewareHandler<ApiEnv> {
  if (!(Number.isInteger(maxBytes) && maxBytes > 0)) {
    throw new Error(`requestBodyLimit: maxBytes must be a positive whole number, got ${maxBytes}`);
  }
  const refuse = () => {
    throw new ComputeError(
      'INVALID_INPUT',
      `the request body is larger than the limit of ${describeBytes(maxBytes)}: send less`,
      { limitBytes: maxBytes },
    );
  };
  const streamed = bodyLimit({ maxSize: maxBytes, onError: refuse });
  return async (c, next) => {
    const length = c.req.header('content-length');
    if (length === undefined || c.req.header('transfer-encoding') !== undefined) return streamed(c, next);
    if (Number.parseInt(length, 10) > maxBytes) refuse();
    await next();
  };
}

/** `application/json` or any `application/…+json`, parameters (`; charset=utf-8`) allowed. */
function isJsonMediaType(contentType: string): boolean {
  const mediaType = contentType.split(';', 1)[0]!.trim().toLowerCase();
  return mediaType === 'application/json' || /^application\/[\w.+-]+\+json$/.test(mediaType);
}

/**
 * INVALID_INPUT unless the request's Content-Type is JSON. A request without one is read as JSON
 * (a call with an empty body needs none).
 */
export function assertJsonContentType(contentType: string | undefined): void {
  if (contentType === undefined || contentType.trim() === '' || isJsonMediaType(contentType)) return;
  throw new ComputeError(
    'INVALID_INPUT',
    `the request body must be JSON (Content-Type: application/json), not ${contentType.slice(0, 100)}`,
  );
}

/** The request's JSON body (an empty body is `{}`); INVALID_INPUT when it does not parse. */
export async function readJsonBody(c: Context<ApiEnv>): Promise<unknown> {
  const text = await c.req.text();
  if (text.trim() === '') return {};
  try {
    return JSON.parse(text);
  } catch (error) {
    const reason = error instanceof SyntaxError ? `: ${error.message.slice(0, 200)}` : '';
    throw new ComputeError('INVALID_INPUT', `the request body is not valid JSON${reason}`);
  }
}
