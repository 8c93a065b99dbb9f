import { parseConfig } from '../../core/config.ts';
import type { Deps } from '../../core/deps.ts';
import { createCompute } from '../../server/compute.ts';
import { listen } from '../../server/http.ts';
import { callApi, createApiFixture, type TestApi } from '../support/api.ts';
import { useFixture } from '../support/hooks.ts';
import { tenantMember } from '../support/iam.ts';

/**
 * The test API (startTestApi) with its configuration read from `env`, as a process reads its
 * environment: e.g. the webhook allowlist or the event stream limits.
 */
export async function startConfiguredApi(env: Record<string, string>): Promise<TestApi> {
  const fixture = await createApiFixture({ max: 10 });
  try {
    const deps: Deps = { ...fixture.deps, config: parseConfig(env) };
    const compute = createCompute(deps);
    const acme = await tenantMember(fixture.iam, 'acme');
    const globex = await tenantMember(fixture.iam, 'globex');
    const server = await listen(compute.app, '127.0.0.1', 0);
    return {
      ...fixture,
      deps,
      compute,
      call: (token, path, body, headers) => callApi(compute.app, token, path, body, headers),
      url: server.url,
      acme,
      globex,
      stop: async () => {
        await server.stop();
        await fixture.stop();
      },
    };
  } catch (error) {
    await fixture.stop();
    throw error;
  }
}

/** startConfiguredApi for the tests of the enclosing file or `describe` block. */
export function useConfiguredApi(env: Record<string, string>): TestApi {
  return useFixture(
    () => startConfiguredApi(env),
    (api) => api.stop(),
  );
}
