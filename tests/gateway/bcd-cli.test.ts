import { execFile } from 'node:child_process';
import { writeFileSync } from 'node:fs';
import { promisify } from 'node:util';
import { describe, expect, it } from 'vitest';
import { useGatewayFixture } from '../support/gateway.ts';

const run = promisify(execFile);
const bcd = (...args: string[]) => run(process.execPath, ['bin/bcd.js', ...args], { encoding: 'utf8' });

describe('the bcd command', () => {
  const fx = useGatewayFixture();

  it('joins with a token (this host, no GPUs), shows its status, and refuses the token a second time', async () => {
    const caFile = `${fx.dir}/ca.pem`;
    writeFileSync(caFile, fx.gateway.caCertificatePem);
    const token = await fx.token(1);
    const dir = `${fx.dir}/bcd`;
    const joined = await bcd(
      'join',
      '--token',
      token,
      '--gateway',
      fx.gateway.address,
      '--ca-file',
      caFile,
      '--dir',
      dir,
      '--name',
      'cli-host',
    );
    expect(joined.stdout).toMatch(/^joined as cli-host \(node_[0-9a-z]{26}\)/);
    const status = JSON.parse(
      (await bcd('status', '--dir', dir, '--root', `${fx.dir}/root`, '--json')).stdout,
    );
    expect(status).toMatchObject({
      joined: true,
      nodeName: 'cli-host',
      gateway: fx.gateway.address,
      holds: [],
    });
    const row = await fx.database.db
      .selectFrom('nodes')
      .select(['id', 'pool_id'])
      .where('id', '=', status.nodeId)
      .executeTakeFirstOrThrow();
    expect(row.pool_id).toBe(fx.poolId);
    const again = bcd(
      'join',
      '--token',
      token,
      '--gateway',
      fx.gateway.address,
      '--ca-file',
      caFile,
      '--dir',
      `${dir}-2`,
    );
    await expect(again).rejects.toMatchObject({
      code: 1,
      stderr: expect.stringContaining('join token is invalid'),
    });
  });
});
