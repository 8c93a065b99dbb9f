import { Hono } from 'hono';
import type { ContentfulStatusCode } from 'hono/utils/http-status';
import type { Deps } from '../core/deps.ts';
import type { Principal } from '../core/iam-port.ts';
import { ComputeError } from '../domain/errors.ts';
import { newId } from '../domain/ids.ts';
import { type Authenticator, bearerToken, createAuthenticator } from './authenticate.ts';
import { mountDoors } from './doors.ts';
import type { ApiEnv } from './env.ts';
import { errorEnvelope, toComputeError } from './envelope.ts';
import type { Credential, MethodDefinition, MethodRegistry, ServerApi } from './method.ts';
import { parseInput } from './validation.ts';

/** The header every call must carry, so a browser form on another site cannot post to the API. */
export const requiredHeader = { name: 'X-Better-Compute', value: '1' } as const;

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
  const auth = authenticate ?? createAuthenticator(deps.iam);
  const api: Record<string, Record<string, unknown>> = {};
  for (const [group, methods] of Object.entries(registry)) {
    api[group] = {};
    for (const [name, method] of Object.entries(methods)) {
      api[group][name] = async (credential: Credential, input: unknown) => {
        const principal = await auth(credentialToken(credential));
        return invoke(deps, method, input, {
          principal,
          requestId: newId('req'),
          signal: new AbortController().signal,
        });
      };
    }
  }
  return api as ServerApi<R>;
}

/**
 * The Hono app: `POST /api/compute/{group}/{method}` with a JSON body and a bearer token, answering
 * `{ data }` or `{ error: { code, message, details?, requestId } }`.
 */
export function createApiApp(
  deps: Deps,
  registry: MethodRegistry,
  options: { authenticate?: Authenticator } = {},
) {
  const authenticate = options.authenticate ?? createAuthenticator(deps.iam);
  const app = new Hono<ApiEnv>();

  app.use('*', async (c, next) => {
    const requestId = c.req.header('x-request-id')?.slice(0, 100) || newId('req');
    c.set('requestId', requestId);
    c.header('x-request-id', requestId);
    await next();
  });

  app.onError((error, c) => {
    const requestId = c.get('requestId') ?? newId('req');
    const computeError = toComputeError(error, deps.log.child({ requestId, path: c.req.path }));
    const { status, body } = errorEnvelope(computeError, requestId);
    return c.json(body, status as ContentfulStatusCode);
  });

  app.notFound((c) => {
    throw new ComputeError(
      'NOT_FOUND',
      `no such endpoint ${c.req.method} ${c.req.path}: methods are POST /api/compute/{group}/{method}`,
    );
  });

  app.get('/healthz', (c) => c.json({ data: { ok: true } }));
  mountDoors(app, { deps, registry, authenticate });

  app.post('/api/compute/:group/:method', async (c) => {
    const method = registry[c.req.param('group')]?.[c.req.param('method')];
    if (!method) {
      throw new ComputeError('NOT_FOUND', `unknown method ${c.req.param('group')}.${c.req.param('method')}`);
    }
    if (c.req.header(requiredHeader.name) !== requiredHeader.value) {
      throw new ComputeError(
        'INVALID_INPUT',
        `missing header ${requiredHeader.name}: ${requiredHeader.value} (every API call must send it)`,
      );
    }
    const principal = await authenticate(bearerToken(c.req.header('authorization')));
    let body: unknown;
    try {
      const text = await c.req.text();
      body = text.trim() === '' ? {} : JSON.parse(text);
    } catch {
      throw new ComputeError('INVALID_INPUT', 'the request body is not valid JSON');
    }
    const data = await invoke(deps, method, body, {
      principal,
      requestId: c.get('requestId'),
      signal: c.req.raw.signal,
    });
    return c.json({ data });
  });

  return app;
}
