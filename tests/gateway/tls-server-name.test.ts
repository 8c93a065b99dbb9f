import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { SimHardware } from '../../daemon/hardware.ts';
import { joinWithToken } from '../../daemon/identity.ts';
import { createJoinToken } from '../../db/nodes/join-tokens.ts';
import { createCertificateAuthority } from '../../domain/pki.ts';
import type { StartedGateway } from '../../gateway/server.ts';
import { useTestDatabase } from '../support/database.ts';
import { seedPool } from '../support/fleet.ts';
import { startTestGateway } from '../support/gateway.ts';
import { useTempDir } from '../support/temp-dir.ts';

/**
 * bcd dials the gateway by IP address: TLS carries no IP as server name (RFC 6066, which Node warns
 * about once a process), and the gateway's certificate is still checked against the IP dialled.
 */
describe('dialling the gateway by IP address', () => {
  const t = useTestDatabase();
  const dir = useTempDir('bc-tls-');
  const warnings: Array<Error & { code?: string }> = [];
  const onWarning = (warning: Error) => warnings.push(warning);
  let gateway: StartedGateway;
  let poolId: string;
  beforeAll(async () => {
    process.on('warning', onWarning);
    ({ poolId } = await seedPool(t.db));
    // Listening on every address, so 127.0.0.2 reaches it too; its certificate names 127.0.0.1 only.
    gateway = await startTestGateway({ db: t.db, host: '0.0.0.0' });
  });
  afterAll(async () => {
    process.off('warning', onWarning);
    await gateway?.stop();
  });

  const join = async (address: string, name: string, caCertificatePem = gateway.caCertificatePem) =>
    joinWithToken({
      gateway: address,
      token: (await createJoinToken(t.db, { poolId, ttlSeconds: 600, maxUses: 1 })).token,
      caCertificatePem,
      dir: `${dir}/${name}`,
      evidence: new SimHardware(name).evidence(),
      requestedName: name,
      agentVersion: 'test',
    });

  it('joins over 127.0.0.1 without a TLS server name warning', async () => {
    const joined = await join(`127.0.0.1:${gateway.port}`, 'by-ip');
    expect(joined.nodeId).toMatch(/^node_/);
    expect(warnings.filter((w) => w.code === 'DEP0123')).toEqual([]);
  });

  it('refuses at once, and says what to pass, when the CA file does not verify the gateway', async () => {
    const other = await createCertificateAuthority('other.example');
    const refused = await join(`127.0.0.1:${gateway.port}`, 'wrong-ca', other.certificatePem).catch(
      (error: unknown) => error,
    );
    expect(refused).toMatchObject({
      code: 'INVALID_INPUT',
      message: expect.stringMatching(
        /does not verify \(self-signed certificate in certificate chain\).*--ca-file/,
      ),
    });
  });

  it('refuses a gateway whose certificate does not name the IP dialled', async () => {
    await expect(join(`127.0.0.2:${gateway.port}`, 'wrong-ip')).rejects.toMatchObject({
      details: expect.stringMatching(/127\.0\.0\.2/),
    });
  });
});
