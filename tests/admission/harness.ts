import { type ApiFixture, createApiFixture } from '../support/api.ts';
import type { TestDatabase } from '../support/database.ts';
import { useFixture } from '../support/hooks.ts';
import { RecordingLifecycle } from '../support/recording-lifecycle.ts';

/** The API in process (see createApiFixture) with the names the admission tests use. */
export interface AdmissionHarness
  extends Pick<ApiFixture, 'iam' | 'deps' | 'compute' | 'decisions' | 'call'> {
  t: TestDatabase;
  rootToken: string;
  /** What admission asked of the lifecycle seam (a recorder, not a stand-in for Temporal). */
  lifecycle: RecordingLifecycle;
  close(): Promise<void>;
}

/** The API in process over a fresh database, without Temporal: the lifecycle seam records. */
export async function createAdmissionHarness(
  options: { max?: number; lifecycle?: RecordingLifecycle } = {},
): Promise<AdmissionHarness> {
  const lifecycle = options.lifecycle ?? new RecordingLifecycle();
  const api = await createApiFixture({ max: options.max ?? 20, deps: { lifecycle } });
  return {
    t: api.database,
    iam: api.iam,
    deps: api.deps,
    compute: api.compute,
    rootToken: api.root.token,
    lifecycle,
    decisions: api.decisions,
    call: api.call,
    close: api.stop,
  };
}

/** createAdmissionHarness for the tests of the enclosing file or `describe` block. */
export function useAdmissionHarness(
  options: { max?: number; lifecycle?: RecordingLifecycle } = {},
): AdmissionHarness {
  return useFixture(
    () => createAdmissionHarness(options),
    (h) => h.close(),
  );
}
