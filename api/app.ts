import { Hono } from 'hono';
import type { ContentfulStatusCode } from 'hono/utils/http-status';
import { asUnavailable } from '../core/dependency-unavailable.ts';
import type { Deps } from '../core/deps.ts';
import type { Principal } from '../core/iam-port.ts';
import { ComputeError } from '../domain/errors.ts';
import { requiredHeader } from '../domain/http-protocol.ts';
import { newId } from '../domain/ids.ts';
import { type Authenticator, bearerToken, createAuthenticator } from './authenticate.ts';
import { withFailedLookupCache } from './authenticate-cache.ts';
import { mountDoors } from './doors.ts';
import type { ApiEnv } from './env.ts';
import { errorEnvelope, toComputeError } from './envelope.ts';
import {
  type Credential,
  findMethod,
  type MethodDefinition,
  type MethodRegistry,
  type ServerApi,
} from './method.ts';
import { methodNotAllowed } from './method-not-allowed.ts';
import { createRateLimiter, type RateLimits, rateLimitsFromConfig } from './rate-limit.ts';
import { assertJsonContentType, readJsonBody, requestBodyLimit } from './request-body.ts';
import { requestIdMiddleware } from './request-id.ts';
import { assertSafeInput, parseInput } from './validation.ts';

interface Invocation {
  principal: Principal;
  requestId: string;
  signal: AbortSignal;
}

async function invoke(
  deps: Deps,
  method: MethodDefinition,
  input: unknown,
  call: Invocation,
): Promise<unknown> {
  assertSafeInput(input);
  const parsed = parseInput(method.input, input);
  const log = deps.log.child({ requestId: call.requestId });
  const output = await method.handler(
    { deps, principal: call.principal, requestId: call.requestId, log, signal: call.signal },
    parsed,
  );
  return method.output.parse(output);
}

function credentialToken(credential: Credential): string | undefined {
  if ('token' in credential) return credential.token;
  const headers = credential.headers;
  const authorization = headers instanceof Headers ? headers.get('authorization') : headers.authorization;
  return bearerToken(authorization);
}

/** `compute.api.{group}.{method}(credential, input)`: the same methods, in process. */
export function createServerApi<R extends MethodRegistry>(
  deps: Deps,
  registry: R,
  authenticate?: Authenticator,
) {
  const auth = authenticate ?? withFailedLookupCache(createAuthenticator(deps.iam));
  const api: Record<string, Record<string, unknown>> = {};
  for (const [group, methods] of Object.entries(registry)) {
    api[group] = {};
    for (const [name, method] of Object.entries(methods)) {
      api[group][name] = async (credential: Credential, input: unknown) => {
        try {
          const principal = await auth(credentialToken(credential));
          return await invoke(deps, method, input, {
            principal,
            requestId: newId('req'),
            signal: new AbortController().signal,
          });
        } catch (error) {
          // The same typed answer as over HTTP when the database or Temporal is out of reach.
          throw asUnavailable(error) ?? error;
        }
      };
    }
  }
  return api as ServerApi<R>;
}

export interface ApiAppOptions {
  authenticate?: Authenticator;
  /** Per-token and per-tenant limits; default from `deps.config` (`BETTER_COMPUTE_RATE_LIMIT_*`). */
  rateLimits?: RateLimits;
  /** The largest request body; default 1 MiB. */
  maxBodyBytes?: number;
}

/**
 * The Hono app: `POST /api/compute/{group}/{method}` with a JSON body and a bearer token, answering
 * `{ data }` or `{ error: { code, message, details?, requestId } }`. Before a handler runs, a call
 * passes, in order: the method lookup (NOT_FOUND), the required header, a JSON content type,
 * authentication (UNAUTHENTICATED), the per-token and per-tenant rate limits (RATE_LIMITED), the
 * 1 MiB body limit, JSON parsing, the depth and character check, then the method's schema (all
 * INVALID_INPUT). Another HTTP method on a method's route is 405 with `Allow: POST`.
 */
export function createApiApp(deps: Deps, registry: MethodRegistry, options: ApiAppOptions = {}) {
  const authenticate = options.authenticate ?? withFailedLookupCache(createAuthenticator(deps.iam));
  const admit = createRateLimiter(options.rateLimits ?? rateLimitsFromConfig(deps.config));
  const app = new Hono<ApiEnv>();

  app.use('*', requestIdMiddleware());

  app.onError((error, c) => {
    const requestId = c.get('requestId') ?? newId('req');
    const computeError = toComputeError(error, deps.log.child({ requestId, path: c.req.path }));
    const { status, body, headers } = errorEnvelope(computeError, requestId);
    return c.json(body, status as ContentfulStatusCode, headers);
  });

  app.notFound((c) => {
    throw new ComputeError(
      'NOT_FOUND',
      `no such endpoint ${c.req.method} ${c.req.path}: methods are POST /api/compute/{group}/{method}`,
    );
  });

  app.get('/healthz', (c) => c.json({ data: { ok: true } }));
  mountDoors(app, { deps, registry, authenticate });

  const route = '/api/compute/:group/:method';
  app.post(
    route,
    async (c, next) => {
      c.set('method', findMethod(registry, c.req.param('group'), c.req.param('method')));
      if (c.req.header(requiredHeader.name) !== requiredHeader.value) {
        throw new ComputeError(
          'INVALID_INPUT',
          `missing header ${requiredHeader.name}: ${requiredHeader.value} (every API call must send it)`,
        );
      }
      assertJsonContentType(c.req.header('content-type'));
      const principal = await authenticate(bearerToken(c.req.header('authorization')));
      admit(principal);
      c.set('principal', principal);
      await next();
    },
    requestBodyLimit(options.maxBodyBytes),
    async (c) => {
      const data = await invoke(deps, c.get('method'), await readJsonBody(c), {
        principal: c.get('principal'),
        requestId: c.get('requestId'),
        signal: c.req.raw.signal,
      });
      return c.json({ data });
    },
  );
  // Reached by every other HTTP method (the POST route answers first; HEAD is routed as GET).
  app.all(route, (c) => {
    findMethod(registry, c.req.param('group'), c.req.param('method'));
    return methodNotAllowed(c, ['POST']);
  });

  return app;
}
