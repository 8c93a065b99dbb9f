import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { parseConfig } from '../../core/config.ts';
import type { LifecycleSignal, ReservationLifecycle } from '../../core/deps.ts';
import { createLogger } from '../../core/logger.ts';
import { insertPool, insertSite } from '../../db/nodes/fleet.ts';
import { createJoinToken } from '../../db/nodes/join-tokens.ts';
import type { GatewayOptions } from '../../gateway/options.ts';
import { type StartedGateway, startGateway } from '../../gateway/server.ts';
import { createTestDatabase, type TestDatabase } from '../support/database.ts';

/** Signals the gateway sent, recorded at the lifecycle seam (the workflow side is helper C's). */
export class RecordingLifecycle implements ReservationLifecycle {
  readonly signals: Array<{ reservationId: string; signal: LifecycleSignal }> = [];
  async start(): Promise<void> {}
  async signal(reservationId: string, signal: LifecycleSignal): Promise<void> {
    this.signals.push({ reservationId, signal });
  }
  async wakePool(): Promise<void> {}
  async running(): Promise<Set<string>> {
    return new Set();
  }
}

export interface GatewayFixture {
  database: TestDatabase;
  gateway: StartedGateway;
  lifecycle: RecordingLifecycle;
  siteId: string;
  poolId: string;
  dir: string;
  token(maxUses?: number, ttlSeconds?: number): Promise<string>;
  restart(options?: Partial<GatewayOptions>): Promise<StartedGateway>;
  close(): Promise<void>;
}

export const testLog = createLogger({ level: process.env.LOG_LEVEL ?? 'silent', name: 'gateway-test' });

/** A real database, a real gateway on a loopback port with real mutual TLS, a site and a pool. */
export async function gatewayFixture(options: Partial<GatewayOptions> = {}): Promise<GatewayFixture> {
  const database = await createTestDatabase();
  const siteId = await insertSite(database.db, { name: 'dc-1', region: 'eu-1' });
  const poolId = await insertPool(database.db, {
    siteId,
    ownerTenantId: 'tnt_root',
    name: 'h100',
    gpuModel: 'h100',
  });
  const lifecycle = new RecordingLifecycle();
  const config = parseConfig({});
  const start = (port: number, opts: Partial<GatewayOptions>) =>
    startGateway({
      config,
      db: database.db,
      log: testLog,
      lifecycle,
      host: '127.0.0.1',
      port,
      options: { deliveryIntervalMs: 50, certificateCheckMs: 500, ...opts },
    });
  const fixture: GatewayFixture = {
    database,
    gateway: await start(0, options),
    lifecycle,
    siteId,
    poolId,
    dir: mkdtempSync(path.join(tmpdir(), 'bc-gw-')),
    token: async (maxUses = 1, ttlSeconds = 600) =>
      (await createJoinToken(database.db, { poolId, ttlSeconds, maxUses })).token,
    restart: async (opts = options) => {
      const port = fixture.gateway.port;
      await fixture.gateway.stop();
      fixture.gateway = await start(port, opts);
      return fixture.gateway;
    },
    close: async () => {
      await fixture.gateway.stop();
      await database.drop();
      rmSync(fixture.dir, { recursive: true, force: true });
    },
  };
  return fixture;
}

/** Polls until `check` answers a truthy value or the time runs out. */
export async function eventually<T>(
  check: () => Promise<T | null | undefined | false>,
  timeoutMs = 20_000,
): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  let last: unknown;
  while (Date.now() < deadline) {
    try {
      const value = await check();
      if (value) return value;
    } catch (error) {
      last = error;
    }
    await new Promise((r) => setTimeout(r, 50));
  }
  throw new Error(`condition not met within ${timeoutMs} ms${last ? `: ${String(last)}` : ''}`);
}
