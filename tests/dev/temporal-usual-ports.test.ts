import { rmSync } from 'node:fs';
import path from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import {
  defaultToolsDir,
  startTemporalDevServer,
  type TemporalDevServer,
  waitForTemporal,
} from '../../temporal/dev-server.ts';
import { testLogger } from '../support/logger.ts';
import { makeStackDir } from '../support/temp-dir.ts';

/**
 * Two dev stacks started at the same moment both find the usual Temporal ports free; only one
 * server can take them. The other must start on free ports of its own, and never take the first
 * one's frontend (answering on the port it could not bind) for its own.
 */
describe('Temporal dev servers started at once', () => {
  const dir = makeStackDir('bc-temporal-ports-');
  const servers: TemporalDevServer[] = [];
  afterAll(async () => {
    await Promise.all(servers.map((server) => server.stop()));
    rmSync(dir, { recursive: true, force: true });
  });

  it('each runs on ports of its own, the usual ones at most once', async () => {
    const log = testLogger('temporal-ports', 'silent');
    const started = await Promise.allSettled(
      ['a', 'b', 'c'].map((name) =>
        startTemporalDevServer({
          dataDir: path.join(dir, name),
          toolsDir: process.env.BETTER_COMPUTE_TOOLS_DIR ?? defaultToolsDir(),
          log,
          persist: false,
        }),
      ),
    );
    for (const result of started) if (result.status === 'fulfilled') servers.push(result.value);
    expect(started.map((result) => result.status)).toEqual(['fulfilled', 'fulfilled', 'fulfilled']);

    const ports = servers.map((server) => server.port);
    expect(new Set(ports).size).toBe(3);
    expect(new Set(servers.map((server) => server.uiPort)).size).toBe(3);
    expect(ports.filter((port) => port === 7233).length).toBeLessThanOrEqual(1);
    // Each answers, and each one stopped takes only its own frontend with it.
    for (const server of servers) await waitForTemporal(server.address, 10_000);
    await servers[0]!.stop();
    await servers[0]!.exited;
    for (const server of servers.slice(1)) await waitForTemporal(server.address, 10_000);
  }, 180_000);
});
