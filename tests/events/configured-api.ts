import { startTestApi, type TestApi, useTestApi } from '../support/api.ts';

/**
 * The test API (startTestApi) with its configuration read from `env`, as a process reads its
 * environment: e.g. the webhook allowlist or the event stream limits.
 */
export const startConfiguredApi = (env: Record<string, string>): Promise<TestApi> => startTestApi({ env });

/** startConfiguredApi for the tests of the enclosing file or `describe` block. */
export const useConfiguredApi = (env: Record<string, string>): TestApi => useTestApi({ env });
