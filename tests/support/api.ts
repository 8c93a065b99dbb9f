import { parseConfig } from '../../core/config.ts';
import type { Deps } from '../../core/deps.ts';
import { bootstrapPlatform } from '../../iam/bootstrap.ts';
import { createEmbeddedIam, type EmbeddedIam } from '../../iam/embedded/index.ts';
import { type Compute, createCompute } from '../../server/compute.ts';
import { type HttpServer, listen } from '../../server/http.ts';
import { createTestDatabase, type TestDatabase } from './database.ts';
import { useFixture } from './hooks.ts';
import { type TenantMember, tenantMember } from './iam.ts';
import { testLogger } from './logger.ts';
import { testDeploymentSecret } from './secret.ts';

export interface ApiAnswer {
  status: number;
  body: any;
}

/** POST /api/compute/{path} through a Hono app in process; answers the status and the parsed body. */
export async function callApi(
  app: Compute['app'],
  token: string | null,
  path: string,
  body: unknown,
  headers: Record<string, string> = {},
): Promise<ApiAnswer> {
  const response = await app.request(`/api/compute/${path}`, {
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
}

export interface ApiFixture {
  database: TestDatabase;
  /** The embedded IAM itself (its decisions through `deps.iam` are counted in `decisions`). */
  iam: EmbeddedIam;
  deps: Deps;
  compute: Compute;
  /** The platform's root admin. */
  root: TenantMember;
  /** Every IAM decision the API asked for (require), in order. */
  decisions: Array<{ action: string; resourceId: string }>;
  /** POST /api/compute/{path} through the app in process. */
  call(
    token: string | null,
    path: string,
    body: unknown,
    headers?: Record<string, string>,
  ): Promise<ApiAnswer>;
  stop(): Promise<void>;
}

export interface ApiFixtureOptions {
  /** Connections in the database pool (default 20). */
  max?: number;
  /** Configuration variables, as the process environment would give them (default: the test secret only). */
  env?: Record<string, string>;
  /** Temporal or a lifecycle, when a test needs them. */
  deps?: Partial<Pick<Deps, 'temporal' | 'lifecycle'>>;
}

/** The API over a fresh real database with the real embedded IAM and the platform bootstrapped, in process. */
export async function createApiFixture(options: ApiFixtureOptions = {}): Promise<ApiFixture> {
  const database = await createTestDatabase({ max: options.max ?? 20 });
  const log = testLogger('api-test');
  const iam = createEmbeddedIam({ db: database.db, log });
  const decisions: ApiFixture['decisions'] = [];
  const counted: EmbeddedIam = {
    ...iam,
    require: async (principal, action, resource, context) => {
      decisions.push({ action, resourceId: resource.id });
      return iam.require(principal, action, resource, context);
    },
  };
  const deps: Deps = {
    config: parseConfig({ BETTER_COMPUTE_SECRET: testDeploymentSecret, ...options.env }),
    db: database.db,
    log,
    iam: counted,
    ...options.deps,
  };
  const compute = createCompute(deps);
  const platform = await bootstrapPlatform(iam).catch(async (error: unknown) => {
    await database.drop();
    throw error;
  });
  return {
    database,
    iam,
    deps,
    compute,
    root: {
      tenantId: platform.rootTenantId,
      identityId: platform.rootAdminIdentityId,
      token: platform.rootAdminToken,
    },
    decisions,
    call: (token, path, body, headers) => callApi(compute.app, token, path, body, headers),
    stop: () => database.drop(),
  };
}

export interface TestApi extends ApiFixture {
  url: string;
  /** A tenant `acme` with one member. */
  acme: TenantMember;
  /** Another tenant, to prove isolation. */
  globex: TenantMember;
}

/**
 * The API served on a real loopback port (see createApiFixture), with member tokens of tenants
 * `acme` and `globex`.
 */
export async function startTestApi(options: Pick<ApiFixtureOptions, 'env'> = {}): Promise<TestApi> {
  const fixture = await createApiFixture({ max: 10, ...options });
  let acme: TenantMember;
  let globex: TenantMember;
  let server: HttpServer;
  try {
    acme = await tenantMember(fixture.iam, 'acme');
    globex = await tenantMember(fixture.iam, 'globex');
    server = await listen(fixture.compute.app, '127.0.0.1', 0);
  } catch (error) {
    await fixture.stop();
    throw error;
  }
  return {
    ...fixture,
    url: server.url,
    acme,
    globex,
    stop: async () => {
      await server.stop();
      await fixture.stop();
    },
  };
}

/** startTestApi for the tests of the enclosing file or `describe` block. */
export function useTestApi(options: Pick<ApiFixtureOptions, 'env'> = {}): TestApi {
  return useFixture(
    () => startTestApi(options),
    (api) => api.stop(),
  );
}
