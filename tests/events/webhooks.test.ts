import { createServer, type IncomingMessage, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { type ComputeClient, type ComputeClientError, createComputeClient } from '../../client/index.ts';
import { newId } from '../../domain/ids.ts';
import { startWebhookDispatcher, type WebhookDispatcher } from '../../events/webhook-dispatcher.ts';
import { signWebhook, verifyWebhook } from '../../events/webhook-signature.ts';
import { insertOutboxEvent } from '../support/events.ts';
import { useConfiguredApi } from './configured-api.ts';

interface Received {
  path: string;
  headers: IncomingMessage['headers'];
  body: string;
  at: number;
}

// The receiver listens on loopback over http: only the development allowlist lets webhooks reach it.
const api = useConfiguredApi({ BETTER_COMPUTE_WEBHOOK_ALLOW_HOSTS: '127.0.0.1' });
let receiver: Server;
let receiverUrl: string;
let dispatcher: WebhookDispatcher;
const received: Received[] = [];
const calls = new Map<string, number>();

beforeAll(async () => {
  receiver = createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on('data', (c: Buffer) => chunks.push(c));
    req.on('end', () => {
      const path = req.url ?? '/';
      const n = (calls.get(path) ?? 0) + 1;
      calls.set(path, n);
      received.push({ path, headers: req.headers, body: Buffer.concat(chunks).toString(), at: Date.now() });
      if (path === '/hang') return; // never answers
      if (path === '/down') return void res.writeHead(503).end();
      if (path === '/flaky' && n <= 2) return void res.writeHead(500).end('not yet');
      res.writeHead(204).end();
    });
  });
  await new Promise<void>((resolve) => receiver.listen(0, '127.0.0.1', resolve));
  receiverUrl = `http://127.0.0.1:${(receiver.address() as AddressInfo).port}`;
});

afterAll(async () => {
  await dispatcher?.stop();
  receiver?.closeAllConnections();
  await new Promise<void>((resolve) => receiver?.close(() => resolve()));
});

function emit(type: string, tenantId = 'acme') {
  const id = newId('evt');
  return insertOutboxEvent(api.database.db, {
    id,
    type,
    subject: `reservation/rsv_${id}`,
    tenantId,
    data: { type },
  });
}

async function until<T>(read: () => T | undefined, timeoutMs = 30_000): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const value = read();
    if (value !== undefined) return value;
    if (Date.now() > deadline) throw new Error('timed out waiting');
    await new Promise((r) => setTimeout(r, 25));
  }
}

/** The webhook's delivery records, oldest first, once there are at least `count`. */
async function deliveriesOf(client: ComputeClient, webhookId: string, count: number) {
  const deadline = Date.now() + 30_000;
  for (;;) {
    const { items } = await client.webhooks.deliveries({ tenantId: 'acme', webhookId });
    if (items.length >= count || Date.now() > deadline) return items.reverse();
    await new Promise((r) => setTimeout(r, 50));
  }
}

describe('webhooks', () => {
  test('signed deliveries in order; a failing or hanging endpoint slows no one else; retries and give-up are recorded', async () => {
    const identity = await api.iam.admin.createIdentity({
      tenantId: 'acme',
      kind: 'service',
      name: 'acme-ops',
    });
    await api.iam.admin.bindRole({ identityId: identity.id, role: 'admin', tenantId: 'acme' });
    const { token } = await api.iam.admin.createToken({ identityId: identity.id });
    const client = createComputeClient({ baseURL: api.url, token });

    // A member may not manage webhooks; a bad URL is INVALID_INPUT.
    const member = createComputeClient({ baseURL: api.url, token: api.acme.token });
    const denied = await member.webhooks
      .create({ tenantId: 'acme', url: `${receiverUrl}/good` })
      .catch((e) => e);
    expect((denied as ComputeClientError).code).toBe('ACCESS_DENIED');
    const invalid = await client.webhooks.create({ tenantId: 'acme', url: 'ftp://x' }).catch((e) => e);
    expect((invalid as ComputeClientError).code).toBe('INVALID_INPUT');

    const good = await client.webhooks.create({ tenantId: 'acme', url: `${receiverUrl}/good` });
    const onlyActive = await client.webhooks.create({
      tenantId: 'acme',
      url: `${receiverUrl}/active`,
      eventTypes: ['reservation.active'],
    });
    const flaky = await client.webhooks.create({ tenantId: 'acme', url: `${receiverUrl}/flaky` });
    const hang = await client.webhooks.create({ tenantId: 'acme', url: `${receiverUrl}/hang` });
    const down = await client.webhooks.create({ tenantId: 'acme', url: `${receiverUrl}/down` });
    expect(good.secret).toMatch(/^whsec_/);
    expect((await client.webhooks.list({ tenantId: 'acme' })).items.map((w) => w.id)).toEqual([
      good.id,
      onlyActive.id,
      flaky.id,
      hang.id,
      down.id,
    ]);

    dispatcher = startWebhookDispatcher(
      { db: api.database.db, log: api.deps.log, config: api.deps.config },
      { pollMs: 50, timeoutMs: 10_000, maxAttempts: 3, backoffMs: () => 150 },
    );
    const ids = [
      await emit('reservation.placed'),
      await emit('reservation.active'),
      await emit('reservation.released'),
    ];
    await emit('reservation.placed', 'globex');

    // The good endpoint gets all three, in order, while the hanging one still waits out its 10 s
    // deadline (measured from the hanging request, not from the start: a loaded machine may be
    // slow to begin delivering at all; a long deadline keeps "meanwhile" true under load).
    const toGood = await until(() => {
      const list = received.filter((r) => r.path === '/good');
      return list.length >= 3 ? list : undefined;
    });
    expect(toGood.map((r) => r.headers['webhook-id'])).toEqual(ids);
    const hangingSince = received.find((r) => r.path === '/hang')?.at ?? Number.POSITIVE_INFINITY;
    expect(toGood.at(-1)!.at).toBeLessThan(hangingSince + 10_000);
    for (const r of toGood) {
      expect(r.headers['content-type']).toBe('application/json');
      expect(
        verifyWebhook({
          secret: good.secret,
          id: r.headers['webhook-id'] as string,
          timestamp: r.headers['webhook-timestamp'] as string,
          signature: r.headers['webhook-signature'] as string,
          body: r.body,
          nowSeconds: Math.floor(Date.now() / 1000),
        }),
      ).toBe(true);
      expect(JSON.parse(r.body).tenantId).toBe('acme');
    }
    // Another tenant's event never reaches acme's hooks; a type filter is honoured.
    expect(received.some((r) => JSON.parse(r.body).tenantId === 'globex')).toBe(false);
    const toActive = await until(() => {
      const list = received.filter((r) => r.path === '/active');
      return list.length >= 1 ? list : undefined;
    });
    expect(toActive.map((r) => r.headers['x-better-compute-event'])).toEqual(['reservation.active']);

    // The flaky endpoint: two failures, then success, then the rest in order.
    const flakyLog = await until(() => {
      const list = received.filter((r) => r.path === '/flaky');
      return list.length >= 5 ? list : undefined;
    });
    expect(flakyLog.map((r) => r.headers['webhook-id'])).toEqual([ids[0], ids[0], ids[0], ids[1], ids[2]]);
    // The last delivery is recorded just after its response arrives: wait for its record too.
    const flakyRecords = await deliveriesOf(client, flaky.id, 5);
    expect(flakyRecords.map((d) => [d.eventId, d.attempt, d.outcome, d.statusCode])).toEqual([
      [ids[0], 1, 'retrying', 500],
      [ids[0], 2, 'retrying', 500],
      [ids[0], 3, 'succeeded', 204],
      [ids[1], 1, 'succeeded', 204],
      [ids[2], 1, 'succeeded', 204],
    ]);

    // The endpoint that is always down: three attempts per event, then it gives up and moves on.
    const downRecords = await deliveriesOf(client, down.id, 9);
    expect(downRecords.map((d) => [d.eventId, d.attempt, d.outcome])).toEqual(
      ids.flatMap((id) => [
        [id, 1, 'retrying'],
        [id, 2, 'retrying'],
        [id, 3, 'failed'],
      ]),
    );

    // The hanging endpoint is cut off at its deadline and recorded, without holding anyone up.
    const hangRecords = await deliveriesOf(client, hang.id, 1);
    expect(hangRecords[0]).toMatchObject({
      eventId: ids[0],
      attempt: 1,
      outcome: 'retrying',
      statusCode: null,
    });
    expect(hangRecords[0]!.error).toBe('timeout');
    expect(flakyRecords.map((d) => d.error)).toEqual(['http-error', 'http-error', null, null, null]);
    expect(downRecords.every((d) => d.error === 'http-error' && d.statusCode === 503)).toBe(true);

    await client.webhooks.delete({ tenantId: 'acme', webhookId: hang.id });
    const missing = await client.webhooks.delete({ tenantId: 'acme', webhookId: hang.id }).catch((e) => e);
    expect((missing as ComputeClientError).code).toBe('NOT_FOUND');
  }, 120_000);

  test('a signature fails for a changed body, another secret or a stale timestamp', () => {
    const secret = 'whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw';
    const now = 1_790_000_000;
    const signature = signWebhook(secret, 'evt_1', now, '{"a":1}');
    const check = (over: Partial<Parameters<typeof verifyWebhook>[0]>) =>
      verifyWebhook({
        secret,
        id: 'evt_1',
        timestamp: String(now),
        signature,
        body: '{"a":1}',
        nowSeconds: now,
        ...over,
      });
    expect(check({})).toBe(true);
    expect(check({ body: '{"a":2}' })).toBe(false);
    expect(check({ id: 'evt_2' })).toBe(false);
    expect(check({ secret: 'whsec_b3RoZXI=' })).toBe(false);
    expect(check({ nowSeconds: now + 301 })).toBe(false);
    expect(check({ signature: `v1,bogus ${signature}` })).toBe(true);
  });
});
