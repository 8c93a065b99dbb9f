import { createApiApp, createServerApi } from '../api/app.ts';
import { createAuthenticator } from '../api/authenticate.ts';
import { withFailedLookupCache } from '../api/authenticate-cache.ts';
import { methods } from '../api/registry.ts';
import { createAdmissionCaches } from '../core/admission-caches.ts';
import type { Deps } from '../core/deps.ts';

/**
 * The embeddable control plane: `compute.api.{group}.{method}(credential, input)` in process, and
 * `compute.app`, the Hono app serving the same methods over HTTP.
 */
export function createCompute(given: Deps) {
  const deps: Deps = { ...given, caches: given.caches ?? createAdmissionCaches() };
  const authenticate = withFailedLookupCache(createAuthenticator(deps.iam));
  return {
    api: createServerApi(deps, methods, authenticate),
    app: createApiApp(deps, methods, { authenticate }),
    methods,
  };
}

export type Compute = ReturnType<typeof createCompute>;
