/**
 * While PostgreSQL is out of reach, the background loops (the webhook dispatcher, the gateway) log
 * one warn line per outage naming the dependency and that they retry, then one info line when it
 * is back: never a stack per attempt. PostgreSQL is taken away for real: the pools reach the test
 * database through a TCP proxy that drops every connection and refuses new ones while "down".
 */
import { mkdtempSync, rmSync } from 'node:fs';
import net from 'node:net';
import { tmpdir } from 'node:os';
import path from 'node:path';
import pino from 'pino';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { parseConfig } from '../../core/config.ts';
import { createDb, type DbHandle } from '../../db/pool.ts';
import { startWebhookDispatcher } from '../../events/webhook-dispatcher.ts';
import { createTestDatabase, type TestDatabase } from '../support/database.ts';
import { eventually } from '../support/eventually.ts';
import { seedPool } from '../support/fleet.ts';
import { joinSimulatedFleet, startTestGateway } from '../support/gateway.ts';
import { testDeploymentSecret } from '../support/secret.ts';

/** A TCP proxy to PostgreSQL that can go down (every connection dropped, new ones refused) and up. */
async function startPostgresProxy(target: URL) {
  let up = true;
  let refused = 0;
  const open = new Set<net.Socket>();
  const server = net.createServer((client) => {
    if (!up) {
      refused++;
      client.destroy();
      return;
    }
    const upstream = net.connect(Number(target.port), target.hostname);
    const drop = () => {
      client.destroy();
      upstream.destroy();
      open.delete(client);
    };
    open.add(client);
    client.on('error', drop).on('close', drop);
    upstream.on('error', drop).on('close', drop);
    client.pipe(upstream).pipe(client);
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const url = new URL(target);
  url.hostname = '127.0.0.1';
  url.port = String((server.address() as net.AddressInfo).port);
  return {
    url: url.toString(),
    /** Connections refused since the last `down()`. */
    refused: () => refused,
    down() {
      up = false;
      refused = 0;
      for (const socket of open) socket.destroy();
    },
    up() {
      up = true;
    },
    close: () => new Promise<void>((resolve) => server.close(() => resolve())),
  };
}

interface LogLine {
  level: number;
  msg: string;
  err?: unknown;
  dependency?: string;
  [field: string]: unknown;
}

/** A real pino logger (debug and up) whose lines a test reads back. */
function recordingLogger() {
  const lines: LogLine[] = [];
  const log = pino(
    { level: 'debug' },
    { write: (line: string) => void lines.push(JSON.parse(line) as LogLine) },
  );
  return { log, lines };
}

const warnOrWorse = (l: LogLine) => l.level >= 40;
const wentDown = (l: LogLine) => l.level === 40 && /^PostgreSQL cannot be reached: /.test(l.msg);
const cameBack = (l: LogLine) => l.level === 30 && l.msg === 'PostgreSQL is reachable again';
const suppressed = (l: LogLine) => l.msg === 'still out of reach' && l.dependency === 'database';
/** A line that carries a stack: what a failed attempt must no longer write. */
const hasStack = (l: LogLine) => JSON.stringify(l).includes('"stack"');

let database: TestDatabase;
let proxy: Awaited<ReturnType<typeof startPostgresProxy>>;
let proxied: DbHandle;

beforeAll(async () => {
  database = await createTestDatabase();
  proxy = await startPostgresProxy(new URL(database.url));
  proxied = createDb(proxy.url, { max: 4 });
});

afterAll(async () => {
  proxy?.up();
  await proxied?.close();
  await proxy?.close();
  await database?.drop();
});

/** Takes PostgreSQL away until `attempts` connections were refused and 3 more failures were logged quietly. */
async function outage(lines: LogLine[], attempts: number) {
  const before = lines.filter(suppressed).length;
  proxy.down();
  await eventually(
    async () => proxy.refused() >= attempts && lines.filter(suppressed).length >= before + 3,
    60_000,
  );
}

describe('a PostgreSQL outage in the logs', () => {
  it('the webhook dispatcher: one warn line per outage, one info line when it is back, no stacks', async () => {
    const { log, lines } = recordingLogger();
    const dispatcher = startWebhookDispatcher(
      { db: proxied.db, log, config: parseConfig({ BETTER_COMPUTE_SECRET: testDeploymentSecret }) },
      { pollMs: 50 },
    );
    try {
      // Reachable through the proxy, and nothing to say.
      await proxied.db.selectFrom('outbox_events').select('seq').limit(1).execute();
      expect(lines.filter(warnOrWorse)).toEqual([]);

      await outage(lines, 10);
      const during = lines.filter(warnOrWorse);
      expect(during).toHaveLength(1);
      expect(during[0]).toMatchObject({
        dependency: 'database',
        component: 'webhooks',
        msg: expect.stringMatching(/^PostgreSQL cannot be reached: .*retries every 50 ms until it is back$/),
      });
      expect(lines.filter(hasStack)).toEqual([]);

      proxy.up();
      await eventually(async () => lines.some(cameBack), 60_000);
      expect(lines.find(cameBack)).toMatchObject({
        dependency: 'database',
        failedAttempts: expect.any(Number),
      });
      expect((lines.find(cameBack)!.failedAttempts as number) >= 3).toBe(true);

      // A second outage is a second warn line (and a second recovery), still without stacks.
      await outage(lines, 5);
      proxy.up();
      await eventually(async () => lines.filter(cameBack).length === 2, 60_000);
      expect(lines.filter(wentDown)).toHaveLength(2);
      expect(lines.filter(warnOrWorse)).toHaveLength(2);
      expect(lines.filter(hasStack)).toEqual([]);
    } finally {
      proxy.up();
      await dispatcher.stop();
    }
  });

  it('the gateway, with a node connected: one warn line per outage, one info line when it is back, no stacks', async () => {
    const { log, lines } = recordingLogger();
    const { poolId } = await seedPool(database.db, { site: 'dc-outage', region: 'eu-1' });
    const gateway = await startTestGateway({ db: proxied.db, log });
    const dir = mkdtempSync(path.join(tmpdir(), 'bc-outage-'));
    const fleet = await joinSimulatedFleet(gateway, database.db, poolId, {
      nodes: 1,
      rootDir: dir,
      log: pino({ level: 'silent' }),
    });
    try {
      await eventually(async () => gateway.sessionCount() === 1, 60_000);
      const start = lines.length;
      await outage(lines, 10);
      const during = lines.slice(start).filter(warnOrWorse);
      expect(during.map((l) => l.msg)).toEqual([expect.stringMatching(/^PostgreSQL cannot be reached: /)]);
      expect(during[0]).toMatchObject({ dependency: 'database', component: 'gateway' });
      expect(lines.slice(start).filter(hasStack)).toEqual([]);

      proxy.up();
      await eventually(async () => lines.slice(start).some(cameBack), 60_000);
      expect(lines.slice(start).filter(warnOrWorse)).toHaveLength(1);
      // The node's session lived through it.
      expect(gateway.sessionCount()).toBe(1);
    } finally {
      proxy.up();
      await fleet.stop();
      await gateway.stop();
      rmSync(dir, { recursive: true, force: true });
    }
  });
});
