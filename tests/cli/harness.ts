import { parseConfig } from '../../core/config.ts';
import type { Deps } from '../../core/deps.ts';
import { createLogger } from '../../core/logger.ts';
import { bootstrapPlatform } from '../../iam/bootstrap.ts';
import { createEmbeddedIam, type EmbeddedIam } from '../../iam/embedded/index.ts';
import { createCompute } from '../../server/compute.ts';
import { listen } from '../../server/http.ts';
import { createTestDatabase, type TestDatabase } from '../support/database.ts';

export interface TenantLogin {
  tenantId: string;
  identityId: string;
  token: string;
}

export interface TestApi {
  url: string;
  database: TestDatabase;
  deps: Deps;
  iam: EmbeddedIam;
  root: TenantLogin;
  /** A tenant `acme` with one member. */
  acme: TenantLogin;
  /** Another tenant, to prove isolation. */
  globex: TenantLogin;
  stop(): Promise<void>;
}

async function member(iam: EmbeddedIam, tenantId: string, role = 'member'): Promise<TenantLogin> {
  await iam.admin.createTenant({ id: tenantId, name: tenantId });
  const identity = await iam.admin.createIdentity({ tenantId, kind: 'person', name: `${tenantId}-user` });
  await iam.admin.bindRole({ identityId: identity.id, role, tenantId });
  const token = await iam.admin.createToken({ identityId: identity.id, name: 'test' });
  return { tenantId, identityId: identity.id, token: token.token };
}

/**
 * The API served on a real loopback port over a fresh real database with the embedded IAM: the
 * platform's admin token, and member tokens of tenants `acme` and `globex`. `extra` lets a test
 * add Temporal (`temporal`, `lifecycle`) when it needs workflows.
 */
export async function startTestApi(
  extra: Partial<Pick<Deps, 'temporal' | 'lifecycle'>> = {},
): Promise<TestApi> {
  const database = await createTestDatabase({ max: 10 });
  const log = createLogger({ level: 'silent' });
  const iam = createEmbeddedIam({ db: database.db, log });
  const platform = await bootstrapPlatform(iam);
  const root = {
    tenantId: platform.rootTenantId,
    identityId: platform.rootAdminIdentityId,
    token: platform.rootAdminToken,
  };
  const acme = await member(iam, 'acme');
  const globex = await member(iam, 'globex');
  const deps: Deps = { config: parseConfig({}), db: database.db, log, iam, ...extra };
  const compute = createCompute(deps);
  const server = await listen(compute.app, '127.0.0.1', 0);
  return {
    url: server.url,
    database,
    deps,
    iam,
    root,
    acme,
    globex,
    stop: async () => {
      await server.stop();
      await database.drop();
    },
  };
}
