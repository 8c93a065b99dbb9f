import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { afterAll, afterEach, beforeAll, describe, expect, test } from 'vitest';
import { type ComputeClient, type ComputeClientError, createComputeClient } from '../../client/index.ts';
import { parseConfig } from '../../core/config.ts';
import { newId } from '../../domain/ids.ts';
import {
  addressRefusal,
  isAllowlistedTarget,
  parseWebhookAllowHosts,
  webhookFailureReasons,
  webhookUrlRefusal,
} from '../../domain/webhook-target.ts';
import {
  startWebhookDispatcher,
  type WebhookDispatcher,
  type WebhookDispatcherOptions,
} from '../../events/webhook-dispatcher.ts';
import type { HostResolver } from '../../events/webhook-target-resolve.ts';
import { eventually } from '../support/eventually.ts';
import { tenantMember } from '../support/iam.ts';
import { useConfiguredApi } from './configured-api.ts';

describe('webhook target rules (pure)', () => {
  test('only global unicast addresses pass, in every spelling', () => {
    const refused = [
      '127.0.0.1',
      '127.255.0.9',
      '10.1.2.3',
      '172.16.0.1',
      '172.31.255.254',
      '192.168.0.10',
      '169.254.169.254',
      '0.0.0.0',
      '100.64.0.1',
      '224.0.0.251',
      '255.255.255.255',
      '::1',
      '::',
      'fc00::1',
      'fd12:3456::1',
      'fe80::1',
      'ff02::1',
      '::ffff:127.0.0.1',
      '::ffff:7f00:1',
      '::ffff:169.254.169.254',
      '::ffff:10.0.0.1',
      '::ffff:192.168.1.1',
      '64:ff9b::7f00:1',
    ];
    for (const address of refused) expect(addressRefusal(address), address).not.toBeNull();
    expect(addressRefusal('127.0.0.1')).toBe('127.0.0.1 is a loopback address');
    expect(addressRefusal('::ffff:169.254.169.254')).toBe('169.254.169.254 is a link-local address');
    for (const address of ['8.8.8.8', '1.1.1.1', '2001:4860:4860::8888', '::ffff:8.8.8.8', '172.32.0.1']) {
      expect(addressRefusal(address), address).toBeNull();
    }
    expect(addressRefusal('not-an-address')).toMatch(/not an IP address/);
  });

  test('https only, literal addresses judged as the URL parser normalises them; the allowlist opens http and private', () => {
    const none = parseWebhookAllowHosts('');
    const refusal = (url: string, allow = none) => webhookUrlRefusal(new URL(url), allow);
    expect(refusal('http://example.com/hook')).toMatch(/plain http, not https/);
    expect(refusal('https://example.com/hook')).toBeNull();
    expect(refusal('https://8.8.8.8/hook')).toBeNull();
    expect(refusal('https://2130706433/')).toMatch(/127\.0\.0\.1 is a loopback/);
    expect(refusal('https://0x7f.1/')).toMatch(/127\.0\.0\.1 is a loopback/);
    expect(refusal('https://[::ffff:127.0.0.1]/')).toMatch(/127\.0\.0\.1 is a loopback/);
    expect(refusal('https://[0:0:0:0:0:0:0:1]/')).toMatch(/loopback/);

    const allow = parseWebhookAllowHosts(' localhost , 127.0.0.1:8080,[::1]');
    expect(allow).toEqual([
      { host: 'localhost', port: null },
      { host: '127.0.0.1', port: 8080 },
      { host: '[::1]', port: null },
    ]);
    expect(refusal('http://localhost:3000/x', allow)).toBeNull();
    expect(refusal('http://127.0.0.1:8080/x', allow)).toBeNull();
    expect(refusal('http://127.0.0.1:8081/x', allow)).toMatch(/plain http/);
    expect(refusal('https://127.0.0.1:8081/x', allow)).toMatch(/loopback/);
    expect(refusal('http://[::1]:9/x', allow)).toBeNull();
    expect(isAllowlistedTarget(new URL('http://LOCALHOST/'), allow)).toBe(true);
    expect(() => parseWebhookAllowHosts('localhost/path')).toThrow(/not a host or host:port/);
    expect(() => parseConfig({ BETTER_COMPUTE_WEBHOOK_ALLOW_HOSTS: 'http://x' })).toThrow(
      /BETTER_COMPUTE_WEBHOOK_ALLOW_HOSTS is invalid/,
    );
    expect(parseConfig({}).BETTER_COMPUTE_WEBHOOK_ALLOW_HOSTS).toBeUndefined();
  });
});

// Loopback receivers over http: only the allowlist (the address, any port) lets webhooks reach them.
const api = useConfiguredApi({ BETTER_COMPUTE_WEBHOOK_ALLOW_HOSTS: '127.0.0.1' });

interface Receiver {
  url: string;
  port: number;
  hits: Map<string, number>;
  server: Server;
}

async function startReceiver(answer: (req: IncomingMessage, res: ServerResponse) => void): Promise<Receiver> {
  const hits = new Map<string, number>();
  const server = createServer((req, res) => {
    req.resume();
    req.on('end', () => {
      hits.set(req.url ?? '/', (hits.get(req.url ?? '/') ?? 0) + 1);
      answer(req, res);
    });
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const port = (server.address() as AddressInfo).port;
  return { url: `http://127.0.0.1:${port}`, port, hits, server };
}

async function stopReceiver(receiver: Receiver | undefined) {
  if (!receiver) return;
  receiver.server.closeAllConnections();
  await new Promise<void>((resolve) => receiver.server.close(() => resolve()));
}

let receiver: Receiver;
let elsewhere: Receiver;
const dispatchers: WebhookDispatcher[] = [];

beforeAll(async () => {
  // Hit by nobody unless a redirect were followed.
  elsewhere = await startReceiver((_req, res) => void res.writeHead(204).end());
  receiver = await startReceiver((req, res) => {
    if (req.url === '/redirect') {
      return void res.writeHead(302, { location: `${elsewhere.url}/stolen` }).end();
    }
    if (req.url === '/hang') return; // never answers
    res.writeHead(204).end();
  });
});

// Each test's dispatcher stops with it, so none works another test's webhooks with its settings.
afterEach(async () => {
  for (const dispatcher of dispatchers.splice(0)) await dispatcher.stop();
});

afterAll(async () => {
  await stopReceiver(receiver);
  await stopReceiver(elsewhere);
});

/** An admin client of a fresh tenant: its hooks get only its own events, whatever other tests do. */
async function freshTenant(): Promise<{ tenantId: string; client: ComputeClient }> {
  const tenantId = `hooks-${newId('evt').slice(-10).toLowerCase()}`;
  const { token } = await tenantMember(api.iam, tenantId, { kind: 'service', name: 'ops', role: 'admin' });
  return { tenantId, client: createComputeClient({ baseURL: api.url, token }) };
}

async function emit(tenantId: string, type = 'reservation.placed') {
  const id = newId('evt');
  await api.database.db
    .insertInto('outbox_events')
    .values({ id, type, subject: `reservation/${newId('rsv')}`, tenant_id: tenantId, data: '{}' })
    .execute();
  return id;
}

function dispatch(options: WebhookDispatcherOptions & { allowHosts?: string } = {}) {
  const { allowHosts, ...rest } = options;
  const dispatcher = startWebhookDispatcher(
    {
      db: api.database.db,
      log: api.deps.log,
      config: {
        ...parseConfig(allowHosts === undefined ? {} : { BETTER_COMPUTE_WEBHOOK_ALLOW_HOSTS: allowHosts }),
        BETTER_COMPUTE_SECRET: api.deps.config.BETTER_COMPUTE_SECRET,
      },
    },
    // A loopback answer comes well within the timeout even on a loaded machine.
    { pollMs: 50, timeoutMs: 5_000, maxAttempts: 1, ...rest },
  );
  dispatchers.push(dispatcher);
  return dispatcher;
}

async function deliveriesOf(client: ComputeClient, tenantId: string, webhookId: string, count: number) {
  return eventually(async () => {
    const { items } = await client.webhooks.deliveries({ tenantId, webhookId });
    return items.length >= count ? items.reverse() : null;
  });
}

describe('webhooks.create refuses targets webhooks may not reach', () => {
  test('every class of non-public address, literal or resolved, and plain http: INVALID_INPUT, nothing written', async () => {
    const { tenantId, client } = await freshTenant();
    const refused: Array<[string, RegExp]> = [
      ['https://127.0.0.2/hook', /127\.0\.0\.2 is a loopback address/],
      ['https://10.0.0.1/hook', /private/],
      ['https://172.16.5.4/hook', /private/],
      ['https://192.168.1.1/hook', /private/],
      ['https://169.254.169.254/latest/meta-data/', /link-local/],
      ['https://0.0.0.0/hook', /unspecified/],
      ['https://100.64.0.1/hook', /carrier-grade NAT/],
      ['https://224.0.0.1/hook', /multicast/],
      ['https://255.255.255.255/hook', /broadcast/],
      // 127.0.0.1 itself is on this file's allowlist; its neighbour, spelt as one number, is not.
      ['https://2130706434/hook', /127\.0\.0\.2 is a loopback/],
      ['https://[::1]/hook', /loopback/],
      ['https://[::]/hook', /unspecified/],
      ['https://[fc00::1]/hook', /unique local/],
      ['https://[fd00::1]/hook', /unique local/],
      ['https://[fe80::1]/hook', /link-local/],
      ['https://[ff02::1]/hook', /multicast/],
      ['https://[::ffff:127.0.0.1]/hook', /127\.0\.0\.1 is a loopback/],
      ['https://[::ffff:169.254.169.254]/hook', /169\.254\.169\.254 is a link-local/],
      ['https://[::ffff:10.0.0.1]/hook', /10\.0\.0\.1 is a private/],
      // A name is resolved and every address it has is judged.
      ['https://localhost:8443/hook', /localhost resolves to 127\.0\.0\.1, a loopback address/],
      ['http://hooks.example.com/hook', /plain http, not https/],
    ];
    for (const [url, why] of refused) {
      const error = (await client.webhooks.create({ tenantId, url }).catch((e) => e)) as ComputeClientError;
      expect(error.code, url).toBe('INVALID_INPUT');
      expect(error.message, url).toMatch(why);
      expect(error.message, url).toMatch(/BETTER_COMPUTE_WEBHOOK_ALLOW_HOSTS/);
    }
    expect((await client.webhooks.list({ tenantId })).items).toEqual([]);

    // A public literal address, a name that does not resolve (yet: checked at every delivery) and
    // an allowlisted host over http are accepted.
    for (const url of ['https://8.8.8.8/hook', 'https://hooks.invalid/hook', `${receiver.url}/ok`]) {
      expect((await client.webhooks.create({ tenantId, url })).url).toBe(url);
    }
  });
});

describe('delivery', () => {
  test('is refused after resolution when any address is not public, and goes only to the address checked', async () => {
    const { tenantId, client } = await freshTenant();
    const port = receiver.port;
    const mixed = await client.webhooks.create({ tenantId, url: `https://mixed.invalid:${port}/mixed` });
    const mapped = await client.webhooks.create({ tenantId, url: `https://mapped.invalid:${port}/mapped` });
    // Allowed when created; the allowlist no longer holds it when delivered.
    const wasAllowed = await client.webhooks.create({ tenantId, url: `${receiver.url}/was-allowed` });
    const resolved: string[] = [];
    const resolve: HostResolver = async (hostname) => {
      resolved.push(hostname);
      if (hostname === 'mixed.invalid') {
        return [
          { address: '93.184.216.34', family: 4 },
          { address: '127.0.0.1', family: 4 },
        ];
      }
      if (hostname === 'mapped.invalid') return [{ address: '::ffff:127.0.0.1', family: 6 }];
      throw Object.assign(new Error(`getaddrinfo ENOTFOUND ${hostname}`), { code: 'ENOTFOUND' });
    };
    dispatch({ resolve, allowHosts: 'localhost' });
    await emit(tenantId);

    for (const hook of [mixed, mapped, wasAllowed]) {
      const [record] = await deliveriesOf(client, tenantId, hook.id, 1);
      expect(record).toMatchObject({ outcome: 'failed', error: 'refused-target', statusCode: null });
    }
    expect(resolved).toEqual(expect.arrayContaining(['mixed.invalid', 'mapped.invalid']));
    expect([...receiver.hits.keys()].filter((path) => path !== '/ok')).toEqual([]);
  });

  test('connects to the pinned address of an allowlisted name the system cannot resolve', async () => {
    const { tenantId, client } = await freshTenant();
    // Created while the API allowlists the loopback address; delivered by a dispatcher that
    // allowlists the name and resolves it itself.
    const created = await client.webhooks.create({ tenantId, url: `${receiver.url}/pinned` });
    await api.database.db
      .updateTable('webhook_subscriptions')
      .set({ url: `http://pinned.invalid:${receiver.port}/pinned` })
      .where('id', '=', created.id)
      .execute();
    const resolve: HostResolver = async (hostname) => {
      if (hostname === 'pinned.invalid') return [{ address: '127.0.0.1', family: 4 }];
      throw new Error('unknown');
    };
    dispatch({ resolve, allowHosts: 'pinned.invalid' });
    await emit(tenantId);
    const [record] = await deliveriesOf(client, tenantId, created.id, 1);
    expect(record).toMatchObject({ outcome: 'succeeded', statusCode: 204, error: null });
    expect(receiver.hits.get('/pinned')).toBe(1);
  });

  test('never follows a redirect, and the deliveries view shows only closed reasons', async () => {
    const { tenantId, client } = await freshTenant();
    const closedPort = await (async () => {
      const probe = await startReceiver(() => {});
      await stopReceiver(probe);
      return probe.port;
    })();
    const hooks = {
      redirect: await client.webhooks.create({ tenantId, url: `${receiver.url}/redirect` }),
      refused: await client.webhooks.create({ tenantId, url: `http://127.0.0.1:${closedPort}/nobody` }),
      // https to a plain http server: the handshake fails.
      tls: await client.webhooks.create({ tenantId, url: `https://127.0.0.1:${receiver.port}/tls` }),
      hang: await client.webhooks.create({ tenantId, url: `${receiver.url}/hang` }),
      unresolved: await client.webhooks.create({ tenantId, url: 'https://nowhere.invalid/hook' }),
    };
    // Long enough for every other target's failure to come first on a loaded machine; the
    // hanging one waits it out.
    dispatch({ allowHosts: '127.0.0.1', timeoutMs: 3_000 });
    await emit(tenantId);

    const [redirected] = await deliveriesOf(client, tenantId, hooks.redirect.id, 1);
    expect(redirected).toMatchObject({ outcome: 'failed', statusCode: 302, error: 'http-error' });
    expect(receiver.hits.get('/redirect')).toBe(1);
    expect(elsewhere.hits.size).toBe(0);

    const expected = {
      refused: 'connection-failed',
      tls: 'tls-failed',
      hang: 'timeout',
      unresolved: 'connection-failed',
    } as const;
    for (const [name, reason] of Object.entries(expected)) {
      const [record] = await deliveriesOf(client, tenantId, hooks[name as keyof typeof expected].id, 1);
      expect(record, name).toMatchObject({ outcome: 'failed', statusCode: null, error: reason });
    }
    // The wire format: only the closed reasons, never an OS or TLS message.
    const raw = await api.call(api.root.token, 'webhooks/deliveries', { tenantId, webhookId: hooks.tls.id });
    expect(raw.status).toBe(200);
    for (const item of raw.body.data.items) expect(webhookFailureReasons).toContain(item.error);
    expect(JSON.stringify(raw.body)).not.toMatch(/ECONN|EPROTO|SSL|socket|getaddrinfo/i);
  });

  test('database use is bounded: at most maxConcurrent subscriptions are worked at once, and all are served', async () => {
    const { tenantId, client } = await freshTenant();
    let inFlight = 0;
    let most = 0;
    const slow = await startReceiver((_req, res) => {
      inFlight++;
      most = Math.max(most, inFlight);
      setTimeout(() => {
        inFlight--;
        res.writeHead(204).end();
      }, 100);
    });
    try {
      const hooks = [];
      for (let i = 0; i < 8; i++)
        hooks.push(await client.webhooks.create({ tenantId, url: `${slow.url}/h${i}` }));
      dispatch({ allowHosts: '127.0.0.1', maxConcurrent: 2 });
      await emit(tenantId);
      await emit(tenantId);
      for (const hook of hooks) {
        const records = await deliveriesOf(client, tenantId, hook.id, 2);
        expect(records.map((r) => r.outcome)).toEqual(['succeeded', 'succeeded']);
      }
      expect(most).toBeGreaterThan(0);
      expect(most).toBeLessThanOrEqual(2);
    } finally {
      await stopReceiver(slow);
    }
  });
});
