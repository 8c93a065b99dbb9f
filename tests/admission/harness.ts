import { parseConfig } from '../../core/config.ts';
import type { Deps, LifecycleSignal, ReservationLifecycle } from '../../core/deps.ts';
import { createLogger } from '../../core/logger.ts';
import { bootstrapPlatform } from '../../iam/bootstrap.ts';
import { createEmbeddedIam, type EmbeddedIam } from '../../iam/embedded/index.ts';
import { createCompute } from '../../server/compute.ts';
import { createTestDatabase, type TestDatabase } from '../support/database.ts';

/** What the lifecycle seam was asked to do (a recorder, not a stand-in for Temporal's behaviour). */
export interface LifecycleCalls {
  started: Array<{ id: string; state: string }>;
  signals: Array<{ reservationId: string; signal: LifecycleSignal }>;
  wokenPools: string[];
}

export interface AdmissionHarness {
  t: TestDatabase;
  iam: EmbeddedIam;
  deps: Deps;
  compute: ReturnType<typeof createCompute>;
  rootToken: string;
  lifecycle: LifecycleCalls;
  /** Every IAM decision the API asked for (require), in order. */
  decisions: Array<{ action: string; resourceId: string }>;
  /** POST /api/compute/{group}/{method} through the Hono app; answers status and parsed body. */
  call(
    token: string | null,
    path: string,
    body: unknown,
    headers?: Record<string, string>,
  ): Promise<{ status: number; body: any }>;
  close(): Promise<void>;
}

export async function createAdmissionHarness(options: { max?: number } = {}): Promise<AdmissionHarness> {
  const t = await createTestDatabase({ max: options.max ?? 20 });
  const log = createLogger({ level: process.env.LOG_LEVEL ?? 'silent' });
  const iam = createEmbeddedIam({ db: t.db, log });
  const calls: LifecycleCalls = { started: [], signals: [], wokenPools: [] };
  const lifecycle: ReservationLifecycle = {
    start: async (r) => {
      calls.started.push({ id: r.id, state: r.state });
    },
    running: async (ids) => new Set(calls.started.map((r) => r.id).filter((id) => ids.includes(id))),
    signal: async (reservationId, signal) => {
      calls.signals.push({ reservationId, signal });
    },
    wakePool: async (poolId) => {
      calls.wokenPools.push(poolId);
    },
  };
  const decisions: Array<{ action: string; resourceId: string }> = [];
  // The real IAM, with its decisions counted on the way through.
  const counted: EmbeddedIam = {
    ...iam,
    require: async (principal, action, resource, context) => {
      decisions.push({ action, resourceId: resource.id });
      return iam.require(principal, action, resource, context);
    },
  };
  const deps: Deps = { config: parseConfig({}), db: t.db, log, iam: counted, lifecycle };
  const compute = createCompute(deps);
  const { rootAdminToken } = await bootstrapPlatform(iam);
  return {
    t,
    iam,
    deps,
    compute,
    rootToken: rootAdminToken,
    lifecycle: calls,
    decisions,
    async call(token, path, body, headers = {}) {
      const response = await compute.app.request(`/api/compute/${path}`, {
        method: 'POST',
        headers: {
          'content-type': 'application/json',
          'x-better-compute': '1',
          ...(token ? { authorization: `Bearer ${token}` } : {}),
          ...headers,
        },
        body: typeof body === 'string' ? body : JSON.stringify(body),
      });
      return { status: response.status, body: await response.json() };
    },
    close: () => t.drop(),
  };
}
