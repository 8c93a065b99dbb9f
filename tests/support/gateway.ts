import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { parseConfig } from '../../core/config.ts';
import type { Db } from '../../core/database.ts';
import type { ReservationLifecycle } from '../../core/deps.ts';
import type { Logger } from '../../core/logger.ts';
import { type SimulatedFleet, startSimulatedFleet } from '../../daemon/sim.ts';
import { createJoinToken } from '../../db/nodes/join-tokens.ts';
import type { GatewayOptions } from '../../gateway/options.ts';
import { type StartedGateway, startGateway } from '../../gateway/server.ts';
import { createTestDatabase, type TestDatabase } from './database.ts';
import { eventually } from './eventually.ts';
import { seedPool } from './fleet.ts';
import { useFixture } from './hooks.ts';
import { testLogger } from './logger.ts';
import { RecordingLifecycle } from './recording-lifecycle.ts';
import { testDeploymentSecret } from './secret.ts';

export const gatewayTestLog = testLogger('gateway-test');

/**
 * The gateway over `db` with real mutual TLS on a loopback port (or `host`; port 0: a free one),
 * delivering every 50 ms.
 */
export function startTestGateway(input: {
  db: Db;
  lifecycle?: ReservationLifecycle | undefined;
  log?: Logger;
  host?: string;
  port?: number;
  options?: Partial<GatewayOptions>;
}): Promise<StartedGateway> {
  return startGateway({
    config: parseConfig({ BETTER_COMPUTE_SECRET: testDeploymentSecret }),
    db: input.db,
    log: input.log ?? gatewayTestLog,
    ...(input.lifecycle ? { lifecycle: input.lifecycle } : {}),
    host: input.host ?? '127.0.0.1',
    port: input.port ?? 0,
    options: { deliveryIntervalMs: 50, ...input.options },
  });
}

/** What `bcd sim` is given besides where the gateway is and how to join it. */
export type FleetOptions = Omit<
  Parameters<typeof startSimulatedFleet>[0],
  'gatewayAddress' | 'caCertificatePem' | 'joinToken' | 'log'
> & { log?: Logger };

/**
 * `nodes` real bcd agents on fake hardware (`bcd sim`) joining `gateway` with one join token of
 * `poolId` that allows exactly that many uses.
 */
export async function joinSimulatedFleet(
  gateway: StartedGateway,
  db: Db,
  poolId: string,
  options: FleetOptions,
): Promise<SimulatedFleet> {
  const { token } = await createJoinToken(db, { poolId, ttlSeconds: 600, maxUses: options.nodes });
  return startSimulatedFleet({
    ...options,
    gatewayAddress: gateway.address,
    caCertificatePem: gateway.caCertificatePem,
    joinToken: token,
    log: options.log ?? gatewayTestLog,
  });
}

export interface GatewayFixture {
  database: TestDatabase;
  gateway: StartedGateway;
  lifecycle: RecordingLifecycle;
  siteId: string;
  poolId: string;
  /** A temporary directory for node state, removed on close. */
  dir: string;
  /** The fleet `startFleet` started (stopped on close). */
  fleet: SimulatedFleet;
  token(maxUses?: number, ttlSeconds?: number): Promise<string>;
  restart(options?: Partial<GatewayOptions>): Promise<StartedGateway>;
  /** Starts `bcd sim` nodes joining this gateway into the fixture's pool, under `dir`. */
  startFleet(options: Omit<FleetOptions, 'rootDir'>): Promise<SimulatedFleet>;
  close(): Promise<void>;
}

/**
 * A real database with a site and a pool, and a real gateway on a loopback port with real mutual
 * TLS whose lifecycle seam records what it was asked.
 */
export async function createGatewayFixture(options: Partial<GatewayOptions> = {}): Promise<GatewayFixture> {
  const database = await createTestDatabase();
  const { siteId, poolId } = await seedPool(database.db, { site: 'dc-1', region: 'eu-1' });
  const lifecycle = new RecordingLifecycle();
  const start = (port: number, opts: Partial<GatewayOptions>) =>
    startTestGateway({ db: database.db, lifecycle, port, options: { certificateCheckMs: 500, ...opts } });
  let fleet: SimulatedFleet | null = null;
  const fixture: GatewayFixture = {
    database,
    gateway: await start(0, options),
    lifecycle,
    siteId,
    poolId,
    dir: mkdtempSync(path.join(tmpdir(), 'bc-gw-')),
    get fleet() {
      if (!fleet) throw new Error('the gateway fixture has no fleet: call startFleet first');
      return fleet;
    },
    token: async (maxUses = 1, ttlSeconds = 600) =>
      (await createJoinToken(database.db, { poolId, ttlSeconds, maxUses })).token,
    restart: async (opts = options) => {
      const port = fixture.gateway.port;
      await fixture.gateway.stop();
      fixture.gateway = await start(port, opts);
      return fixture.gateway;
    },
    startFleet: async (fleetOptions) => {
      fleet = await joinSimulatedFleet(fixture.gateway, database.db, poolId, {
        ...fleetOptions,
        rootDir: fixture.dir,
      });
      return fleet;
    },
    close: async () => {
      await fleet?.stop();
      await fixture.gateway.stop();
      await database.drop();
      rmSync(fixture.dir, { recursive: true, force: true });
    },
  };
  return fixture;
}

/**
 * createGatewayFixture for the tests of the enclosing file or `describe` block; with `fleet`, also
 * its simulated nodes, waited for until they hold sessions (`connected`) or are provisioned (`ready`).
 */
export function useGatewayFixture(
  options: Partial<GatewayOptions> = {},
  fleet?: Omit<FleetOptions, 'rootDir'> & { until?: 'connected' | 'ready' },
): GatewayFixture {
  return useFixture(
    async () => {
      const fixture = await createGatewayFixture(options);
      if (!fleet) return fixture;
      const { until, ...fleetOptions } = fleet;
      try {
        await fixture.startFleet(fleetOptions);
        if (until === 'connected')
          await eventually(async () => fixture.gateway.sessionCount() === fleet.nodes);
        if (until === 'ready') {
          await eventually(async () => {
            const rows = await fixture.database.db.selectFrom('nodes').select('provision_state').execute();
            return rows.length === fleet.nodes && rows.every((r) => r.provision_state === 'ready');
          });
        }
      } catch (error) {
        await fixture.close();
        throw error;
      }
      return fixture;
    },
    (fixture) => fixture.close(),
  );
}
