import type { Context } from 'hono';
import { ComputeError } from '../domain/errors.ts';
import type { ApiEnv } from './env.ts';
import { errorEnvelope } from './envelope.ts';

/**
 * `405 Method Not Allowed` with an `Allow` header, for a route that exists under other HTTP
 * methods. Its envelope's code is INVALID_INPUT (the closed set has no code of its own for it:
 * the request is malformed, and retrying it unchanged never helps); only the status differs from
 * the code's usual 400, so that HTTP tools and fuzzers see the standard answer.
 */
export function methodNotAllowed(c: Context<ApiEnv>, allow: readonly string[]): Response {
  const error = new ComputeError(
    'INVALID_INPUT',
    `${c.req.method} is not allowed on ${c.req.path}: use ${allow.join(' or ')}`,
    { allow: [...allow] },
  );
  const { body } = errorEnvelope(error, c.get('requestId'));
  return c.json(body, 405, { Allow: allow.join(', ') });
}
