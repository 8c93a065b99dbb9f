import { X509Certificate } from 'node:crypto';
import { createServer, type IncomingMessage, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { sql } from 'kysely';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { assertSecretForMode, parseConfig } from '../../core/config.ts';
import { openWebhookSecret } from '../../db/events/webhooks.ts';
import { loadSigningCertificateAuthority } from '../../db/nodes/certificate-authority.ts';
import { createCertificateAuthority, generateKeyPairPem, issueNodeCertificate } from '../../domain/pki.ts';
import { createSealer, SealedValueError } from '../../domain/sealing.ts';
import { startWebhookDispatcher } from '../../events/webhook-dispatcher.ts';
import { verifyWebhook } from '../../events/webhook-signature.ts';
import { startGateway } from '../../gateway/server.ts';
import { createCompute } from '../../server/compute.ts';
import { startControlPlane } from '../../server/serve.ts';
import { callApi, useTestApi } from '../support/api.ts';
import { insertOutboxEvent } from '../support/events.ts';
import { eventually } from '../support/eventually.ts';
import { gatewayTestLog, startTestGateway } from '../support/gateway.ts';
import { tenantMember } from '../support/iam.ts';
import { testDeploymentSecret } from '../support/secret.ts';

const sealer = createSealer(testDeploymentSecret);
const otherSecret = 'another-deployment-secret-of-at-least-32-chars';

// The API (with the tests' deployment secret) over a real database; its webhooks may reach loopback.
const api = useTestApi({ env: { BETTER_COMPUTE_WEBHOOK_ALLOW_HOSTS: '127.0.0.1' } });

async function storedCaKey(): Promise<string | undefined> {
  const row = await api.database.db
    .selectFrom('certificate_authorities')
    .select('private_key_pem')
    .where('name', '=', 'machine')
    .executeTakeFirst();
  return row?.private_key_pem;
}

async function storedWebhookSecret(id: string): Promise<string> {
  const row = await api.database.db
    .selectFrom('webhook_subscriptions')
    .select('secret')
    .where('id', '=', id)
    .executeTakeFirstOrThrow();
  return row.secret;
}

/** A gateway over the API's database with `secret` as its deployment secret. */
function gatewayWith(secret: string | undefined) {
  return startGateway({
    config: parseConfig(secret === undefined ? {} : { BETTER_COMPUTE_SECRET: secret }),
    db: api.database.db,
    log: gatewayTestLog,
    host: '127.0.0.1',
    port: 0,
  });
}

async function rejection(promise: Promise<unknown>): Promise<Error> {
  try {
    await promise;
  } catch (error) {
    return error as Error;
  }
  throw new Error('it did not fail');
}

describe('the CA private key', () => {
  it('a key stored in plaintext before sealing is sealed by the first gateway that reads it, unchanged', async () => {
    // What an older version left in a dev data directory.
    const legacy = await createCertificateAuthority('better-compute.local');
    await sql`INSERT INTO certificate_authorities (name, trust_domain, certificate_pem, private_key_pem)
      VALUES ('machine', 'better-compute.local', ${legacy.certificatePem}, ${legacy.privateKeyPem})`.execute(
      api.database.db,
    );

    const gateway = await startTestGateway({ db: api.database.db });
    try {
      expect(gateway.caCertificatePem).toBe(legacy.certificatePem);
      const stored = (await storedCaKey())!;
      expect(stored).toMatch(/^sealed:v1:ca-key:/);
      expect(stored).not.toContain('PRIVATE KEY');
      expect(sealer.open('ca-key', stored)).toBe(legacy.privateKeyPem);
    } finally {
      await gateway.stop();
    }

    // A second start reads the sealed key as it is (no second upgrade), and it still signs.
    const before = await storedCaKey();
    const ca = await loadSigningCertificateAuthority(api.database.db, {
      trustDomain: 'better-compute.local',
      sealer,
    });
    expect(await storedCaKey()).toBe(before);
    expect(ca.privateKeyPem).toBe(legacy.privateKeyPem);
    const keys = await generateKeyPairPem();
    const cert = await issueNodeCertificate({
      ca,
      publicKeyPem: keys.publicKeyPem,
      spiffeId: 'spiffe://better-compute.local/site/s/node/n',
      nodeName: 'n',
      role: 'node',
      now: new Date(),
      validForMs: 60_000,
    });
    const caPublicKey = new X509Certificate(legacy.certificatePem).publicKey;
    expect(new X509Certificate(cert.certificatePem).verify(caPublicKey)).toBe(true);
  });

  it('a gateway with another deployment secret, or none, refuses to start and says what to check', async () => {
    const changed = await rejection(gatewayWith(otherSecret));
    expect(changed).toBeInstanceOf(SealedValueError);
    expect(changed.message).toContain('has BETTER_COMPUTE_SECRET (the `secret` option) changed');
    expect(changed.message).not.toContain('PRIVATE KEY');

    const none = await rejection(gatewayWith(undefined));
    expect(none.message).toBe(
      'BETTER_COMPUTE_SECRET (the `secret` option) is not set, and the gateway seals secrets at rest with it: generate one with `openssl rand -base64 48` and give every process of this deployment the same value',
    );
    expect((await storedCaKey())!).toMatch(/^sealed:v1:ca-key:/);
  });
});

describe('the CA created by the API', () => {
  it('join tokens carry the CA certificate; creating the CA stores its key sealed; without a secret nothing is written', async () => {
    const { db } = api.database;
    await db.deleteFrom('certificate_authorities').execute();
    const site = await api.call(api.root.token, 'admin/createSite', { name: 'dc-seal', region: 'eu-1' });
    const pool = await api.call(api.root.token, 'admin/createPool', {
      siteId: site.body.data.id,
      name: 'h100',
      gpuModel: 'h100',
    });
    const poolId: string = pool.body.data.id;
    const joinTokens = async () =>
      Number((await sql<{ n: string }>`SELECT count(*) AS n FROM join_tokens`.execute(db)).rows[0]!.n);

    // An embedder's handler without the `secret` option: UNSUPPORTED before any token exists.
    const unsealed = createCompute({
      ...api.deps,
      config: { ...api.deps.config, BETTER_COMPUTE_SECRET: undefined },
    });
    const tokensBefore = await joinTokens();
    const refused = await callApi(unsealed.app, api.root.token, 'joinTokens/create', { poolId });
    expect(refused.status).toBe(422);
    expect(refused.body.error.code).toBe('UNSUPPORTED');
    expect(refused.body.error.message).toContain('BETTER_COMPUTE_SECRET');
    expect(await joinTokens()).toBe(tokensBefore);
    expect(await storedCaKey()).toBeUndefined();

    const created = await api.call(api.root.token, 'joinTokens/create', { poolId });
    expect(created.status).toBe(200);
    const stored = (await storedCaKey())!;
    expect(stored).toMatch(/^sealed:v1:ca-key:/);
    expect(sealer.open('ca-key', stored)).toContain('-----BEGIN PRIVATE KEY-----');
    expect(created.body.data.caCertificatePem).toContain('-----BEGIN CERTIFICATE-----');

    // Once the CA exists, handing out its certificate needs no secret: only the public part is read.
    const again = await callApi(unsealed.app, api.root.token, 'joinTokens/create', { poolId });
    expect(again.status).toBe(200);
    expect(again.body.data.caCertificatePem).toBe(created.body.data.caCertificatePem);
  });
});

describe('webhook signing secrets', () => {
  let receiver: Server;
  let receiverUrl: string;
  const received: Array<{ headers: IncomingMessage['headers']; body: string }> = [];
  beforeAll(async () => {
    receiver = createServer((req, res) => {
      const chunks: Buffer[] = [];
      req.on('data', (c: Buffer) => chunks.push(c));
      req.on('end', () => {
        received.push({ headers: req.headers, body: Buffer.concat(chunks).toString() });
        res.writeHead(204).end();
      });
    });
    await new Promise<void>((resolve) => receiver.listen(0, '127.0.0.1', resolve));
    receiverUrl = `http://127.0.0.1:${(receiver.address() as AddressInfo).port}`;
  });
  afterAll(async () => {
    receiver?.closeAllConnections();
    await new Promise<void>((resolve) => receiver?.close(() => resolve()));
  });

  it('are stored sealed and answered once; another deployment secret cannot open them', async () => {
    const { token } = await tenantMember(api.iam, 'sealing', { kind: 'service', name: 'ops', role: 'admin' });
    const created = await api.call(token, 'webhooks/create', {
      tenantId: 'sealing',
      url: `${receiverUrl}/a`,
    });
    expect(created.status).toBe(200);
    const secret: string = created.body.data.secret;
    expect(secret).toMatch(/^whsec_/);
    const stored = await storedWebhookSecret(created.body.data.id);
    expect(stored).toMatch(/^sealed:v1:webhook-secret:/);
    expect(stored).not.toContain(secret);
    expect(stored).not.toContain(secret.slice('whsec_'.length));
    expect(sealer.open('webhook-secret', stored)).toBe(secret);
    // Purpose-bound: the same sealer cannot take it for a CA key.
    expect(() => sealer.open('ca-key', stored)).toThrow(SealedValueError);

    const listed = await api.call(token, 'webhooks/list', { tenantId: 'sealing' });
    expect(JSON.stringify(listed.body)).not.toContain(secret);

    const other = createSealer(otherSecret);
    const error = await rejection(
      openWebhookSecret(api.database.db, other, { id: created.body.data.id, stored_secret: stored }),
    );
    expect(error).toBeInstanceOf(SealedValueError);
    expect(error.message).toContain('BETTER_COMPUTE_SECRET');
    expect(await storedWebhookSecret(created.body.data.id)).toBe(stored);
  });

  it('without a deployment secret, webhooks.create is UNSUPPORTED and stores nothing', async () => {
    const { token } = await tenantMember(api.iam, 'unsealed', {
      kind: 'service',
      name: 'ops',
      role: 'admin',
    });
    const unsealed = createCompute({
      ...api.deps,
      config: { ...api.deps.config, BETTER_COMPUTE_SECRET: undefined },
    });
    const refused = await callApi(unsealed.app, token, 'webhooks/create', {
      tenantId: 'unsealed',
      url: `${receiverUrl}/b`,
    });
    expect(refused.status).toBe(422);
    expect(refused.body.error.code).toBe('UNSUPPORTED');
    const rows = await api.database.db
      .selectFrom('webhook_subscriptions')
      .select('id')
      .where('tenant_id', '=', 'unsealed')
      .execute();
    expect(rows).toEqual([]);
  });

  it('plaintext ones from before sealing are sealed by the dispatcher (deleted ones too) and still sign deliveries', async () => {
    const { db } = api.database;
    const plain = { live: 'whsec_bGVnYWN5LWxpdmUtc2VjcmV0LW9mLWEtd2ViaG9vaw==', gone: 'whsec_Z29uZQ==' };
    await sql`INSERT INTO webhook_subscriptions (id, tenant_id, url, secret)
      VALUES ('hook_legacy_live', 'legacy', ${`${receiverUrl}/legacy`}, ${plain.live})`.execute(db);
    await sql`INSERT INTO webhook_subscriptions (id, tenant_id, url, secret, deleted_at)
      VALUES ('hook_legacy_gone', 'legacy', ${`${receiverUrl}/gone`}, ${plain.gone}, compute_now())`.execute(
      db,
    );
    const eventId = await insertOutboxEvent(db, {
      type: 'reservation.placed',
      subject: 'reservation/rsv_legacy',
      tenantId: 'legacy',
    });

    const dispatcher = startWebhookDispatcher(
      { db, log: api.deps.log, config: api.deps.config },
      { pollMs: 50, maxAttempts: 1 },
    );
    try {
      const delivery = await eventually(async () =>
        received.find((r) => r.headers['webhook-id'] === eventId),
      );
      expect(
        verifyWebhook({
          secret: plain.live,
          id: eventId,
          timestamp: String(delivery.headers['webhook-timestamp']),
          signature: String(delivery.headers['webhook-signature']),
          body: delivery.body,
          nowSeconds: Math.floor(Date.now() / 1000), // wall time: the signature's timestamp is wall time
        }),
      ).toBe(true);
    } finally {
      await dispatcher.stop();
    }
    for (const [id, secret] of [
      ['hook_legacy_live', plain.live],
      ['hook_legacy_gone', plain.gone],
    ] as const) {
      const stored = await storedWebhookSecret(id);
      expect(stored).toMatch(/^sealed:v1:webhook-secret:/);
      expect(sealer.open('webhook-secret', stored)).toBe(secret);
    }
    const { rows } = await sql<{ n: string }>`
      SELECT count(*) AS n FROM webhook_subscriptions WHERE secret NOT LIKE 'sealed:v1:webhook-secret:%'`.execute(
      db,
    );
    expect(Number(rows[0]!.n)).toBe(0);
  });

  it('a dispatcher without the deployment secret refuses to start', () => {
    expect(() =>
      startWebhookDispatcher({
        db: api.database.db,
        log: api.deps.log,
        config: { ...api.deps.config, BETTER_COMPUTE_SECRET: undefined },
      }),
    ).toThrow(/^BETTER_COMPUTE_SECRET \(the `secret` option\) is not set, and the webhook dispatcher/);
  });
});

describe('process modes', () => {
  it('api, gateway and all refuse to start without the secret, saying how to make one; worker needs none', async () => {
    for (const mode of ['api', 'gateway', 'all'] as const) {
      const error = await rejection(
        startControlPlane({
          mode,
          config: parseConfig({}),
          log: gatewayTestLog,
          databaseUrl: 'postgres://127.0.0.1:1/never-opened',
          temporalAddress: '127.0.0.1:1',
        }),
      );
      expect(error.message).toContain(`is not set, and mode ${mode} seals secrets at rest with it`);
      expect(error.message).toContain('openssl rand -base64 48');
    }
    expect(() => assertSecretForMode(parseConfig({}), 'worker')).not.toThrow();
    expect(() => parseConfig({ BETTER_COMPUTE_SECRET: 'short' })).toThrow(
      'configuration BETTER_COMPUTE_SECRET is invalid: at least 32 characters (generate one with `openssl rand -base64 48`)',
    );
  });
});
