import type { Hono } from 'hono';
import type { Deps } from '../core/deps.ts';
import type { Authenticator } from './authenticate.ts';
import type { ApiEnv } from './env.ts';
import { mountEventStream } from './events-stream.ts';
import type { MethodRegistry } from './method.ts';
import { methodNotAllowed } from './method-not-allowed.ts';
import { buildOpenApiDocument } from './openapi.ts';

/**
 * The routes beside `POST /api/compute/{group}/{method}`: the OpenAPI document (public, generated
 * once from the registry) and the server-sent event stream (bearer auth).
 */
export function mountDoors(
  app: Hono<ApiEnv>,
  context: { deps: Deps; registry: MethodRegistry; authenticate: Authenticator },
) {
  let document: ReturnType<typeof buildOpenApiDocument> | undefined;
  app.get('/api/compute/openapi.json', (c) => {
    document ??= buildOpenApiDocument(context.registry);
    return c.json(document);
  });
  mountEventStream(app, context);
  // Every other HTTP method, before the method route's own 405 (`events/stream` has the shape of
  // a method's path); the GET routes above answer first.
  app.all('/api/compute/openapi.json', (c) => methodNotAllowed(c, ['GET', 'HEAD']));
  app.all('/api/compute/events/stream', (c) => methodNotAllowed(c, ['GET', 'HEAD']));
}
