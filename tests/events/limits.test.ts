import { sql } from 'kysely';
import { describe, expect, test } from 'vitest';
import { type ComputeClientError, createComputeClient, parseSse } from '../../client/index.ts';
import { newId } from '../../domain/ids.ts';
import { untilReadable } from '../support/events.ts';
import { eventually } from '../support/eventually.ts';
import { tenantMember } from '../support/iam.ts';
import { useConfiguredApi } from './configured-api.ts';

const api = useConfiguredApi({
  BETTER_COMPUTE_WEBHOOKS_PER_TENANT: '3',
  BETTER_COMPUTE_EVENT_STREAMS_PER_TOKEN: '2',
  BETTER_COMPUTE_EVENT_STREAMS_PER_TENANT: '3',
  BETTER_COMPUTE_EVENT_STREAM_REPLAY_MAX_EVENTS: '20',
});

async function emit(tenantId: string, subject: string) {
  const id = newId('evt');
  await api.database.db
    .insertInto('outbox_events')
    .values({ id, type: 'reservation.placed', subject, tenant_id: tenantId, data: '{}' })
    .execute();
  return id;
}

async function newestSeq(): Promise<number> {
  const { rows } = await sql<{ seq: string }>`SELECT max(seq) AS seq FROM outbox_events`.execute(
    api.database.db,
  );
  return Number(rows[0]!.seq);
}

interface OpenStream {
  status: number;
  headers: Headers;
  body: { error: { code: string; message: string; details?: Record<string, unknown> } } | null;
  /** The seq the stream starts after (its `ready` frame), for an accepted stream. */
  ready: number | null;
  close(): void;
}

/** Opens the event stream; an accepted one is held open until `close`, after its `ready` frame. */
async function openStream(
  token: string,
  headers: Record<string, string> = {},
  query = '',
): Promise<OpenStream> {
  const controller = new AbortController();
  const response = await fetch(`${api.url}/api/compute/events/stream${query}`, {
    headers: { authorization: `Bearer ${token}`, ...headers },
    signal: controller.signal,
  });
  if (response.status !== 200) {
    return {
      status: response.status,
      headers: response.headers,
      body: (await response.json()) as OpenStream['body'],
      ready: null,
      close() {},
    };
  }
  let ready: number | null = null;
  const frames = parseSse(response.body!)[Symbol.asyncIterator]();
  const first = await frames.next();
  if (!first.done && first.value.event === 'ready') ready = Number(first.value.id);
  return {
    status: 200,
    headers: response.headers,
    body: null,
    ready,
    close: () => controller.abort(),
  };
}

describe('webhooks per tenant', () => {
  test('past the cap, QUOTA_EXCEEDED saying what to do; concurrent creates never pass it together', async () => {
    const { token } = await tenantMember(api.iam, 'capped', { kind: 'service', name: 'ops', role: 'admin' });
    const client = createComputeClient({ baseURL: api.url, token });
    const created = [];
    for (let i = 0; i < 3; i++)
      created.push(await client.webhooks.create({ tenantId: 'capped', url: `https://8.8.8.8/h${i}` }));
    const over = (await client.webhooks
      .create({ tenantId: 'capped', url: 'https://8.8.8.8/h3' })
      .catch((e) => e)) as ComputeClientError;
    expect(over.code).toBe('QUOTA_EXCEEDED');
    expect(over.message).toMatch(/already has 3 webhooks.*delete one/);
    expect(over.details).toMatchObject({ limit: 3 });
    // A deleted one frees its place.
    await client.webhooks.delete({ tenantId: 'capped', webhookId: created[0]!.id });
    await client.webhooks.create({ tenantId: 'capped', url: 'https://8.8.8.8/h4' });
    expect((await client.webhooks.list({ tenantId: 'capped' })).items).toHaveLength(3);

    const racer = await tenantMember(api.iam, 'racing', { kind: 'service', name: 'ops', role: 'admin' });
    const racing = createComputeClient({ baseURL: api.url, token: racer.token });
    const answers = await Promise.all(
      Array.from({ length: 6 }, (_, i) =>
        racing.webhooks.create({ tenantId: 'racing', url: `https://8.8.8.8/r${i}` }).then(
          () => 'created',
          (e: ComputeClientError) => e.code,
        ),
      ),
    );
    expect(answers.filter((a) => a === 'created')).toHaveLength(3);
    expect(answers.filter((a) => a === 'QUOTA_EXCEEDED')).toHaveLength(3);
    expect((await racing.webhooks.list({ tenantId: 'racing' })).items).toHaveLength(3);
  });
});

describe('event streams', () => {
  test('a token and a tenant hold a bounded number of open streams: RATE_LIMITED with retryAfterSeconds', async () => {
    const second = await tenantMember(api.iam, 'acme', { name: 'acme-second' });
    const open: OpenStream[] = [];
    try {
      open.push(await openStream(api.acme.token), await openStream(api.acme.token));
      expect(open.map((s) => s.status)).toEqual([200, 200]);
      const perToken = await openStream(api.acme.token);
      expect(perToken.status).toBe(429);
      expect(perToken.body!.error.code).toBe('RATE_LIMITED');
      expect(perToken.body!.error.message).toMatch(/too many open event streams for this token \(at most 2/);
      expect(perToken.body!.error.details).toMatchObject({ retryAfterSeconds: 5, scope: 'token' });
      expect(perToken.headers.get('retry-after')).toBe('5');

      // Another token of the same tenant: one more, then the tenant's cap (3).
      open.push(await openStream(second.token));
      expect(open[2]!.status).toBe(200);
      const perTenant = await openStream(second.token);
      expect(perTenant.status).toBe(429);
      expect(perTenant.body!.error.details).toMatchObject({ scope: 'tenant' });

      // Another tenant is not held back; the typed client answers the typed error.
      const globex = await openStream(api.globex.token);
      expect(globex.status).toBe(200);
      globex.close();
      const client = createComputeClient({ baseURL: api.url, token: api.acme.token });
      const refused = await (async () => {
        for await (const _ of client.$stream({})) return null;
      })().catch((e: unknown) => e);
      expect((refused as ComputeClientError).code).toBe('RATE_LIMITED');

      // A closed stream frees its slot.
      open.shift()!.close();
      const again = await eventually(async () => {
        const stream = await openStream(api.acme.token);
        return stream.status === 200 ? stream : null;
      });
      open.push(again);
    } finally {
      for (const stream of open) stream.close();
    }
  });

  test('a stream resumes at most BETTER_COMPUTE_EVENT_STREAM_REPLAY_MAX_EVENTS behind; events.list pages further', async () => {
    // A tenant of its own: the streams of the test above may still be closing on the server.
    const reader = await tenantMember(api.iam, 'replayer');
    const subject = `reservation/${newId('rsv')}`;
    const emitted: string[] = [];
    for (let i = 0; i < 30; i++) emitted.push(await emit('replayer', subject));
    const newest = await newestSeq();

    const tooFar = await openStream(reader.token, { 'last-event-id': String(newest - 25) });
    expect(tooFar.status).toBe(400);
    expect(tooFar.body!.error.code).toBe('INVALID_INPUT');
    expect(tooFar.body!.error.message).toMatch(
      /Last-Event-ID \d+ is 25 events behind the newest, and a stream replays at most 20: read what was missed with events\.list pages/,
    );
    const viaQuery = await openStream(reader.token, {}, `?after=${newest - 25}`);
    expect(viaQuery.status).toBe(400);
    expect(viaQuery.body!.error.message).toMatch(/^after \d+ is 25 events behind/);

    const near = await openStream(reader.token, { 'last-event-id': String(newest - 5) });
    expect(near.status).toBe(200);
    expect(near.ready).toBe(newest - 5);
    near.close();
    // after=0 starts at the oldest event still in the window, not at the beginning of history.
    const fromStart = await openStream(reader.token, {}, '?after=0');
    expect(fromStart.status).toBe(200);
    expect(fromStart.ready).toBeGreaterThanOrEqual(newest - 20);
    fromStart.close();

    // events.list has no count limit: it reads those pages.
    const client = createComputeClient({ baseURL: api.url, token: reader.token });
    await untilReadable(api.database.db, emitted);
    const page = await client.events.list({ subject, after: newest - 25, limit: 100 });
    expect(page.items.map((e) => e.seq)).toEqual(Array.from({ length: 25 }, (_, i) => newest - 24 + i));
  });

  test('neither door replays events older than BETTER_COMPUTE_EVENT_REPLAY_MAX_AGE_HOURS (7 days by default)', async () => {
    const reader = await tenantMember(api.iam, 'replayer', { name: 'replayer-aged' });
    const subject = `reservation/${newId('rsv')}`;
    const ids: string[] = [];
    for (let i = 0; i < 30; i++) ids.push(await emit('replayer', subject));
    const { rows } = await sql<{ seq: string }>`
      SELECT seq FROM outbox_events WHERE id = ANY(${ids}::text[]) ORDER BY seq`.execute(api.database.db);
    const seqs = rows.map((r) => Number(r.seq));
    // Everything up to the 20th of them is 8 days old.
    await sql`UPDATE outbox_events SET created_at = compute_now() - interval '8 days' WHERE seq <= ${seqs[19]!}`.execute(
      api.database.db,
    );
    const client = createComputeClient({ baseURL: api.url, token: reader.token });
    await untilReadable(api.database.db, ids);

    const old = (await client.events
      .list({ subject, after: seqs[5]! })
      .catch((e) => e)) as ComputeClientError;
    expect(old.code).toBe('INVALID_INPUT');
    expect(old.message).toMatch(/older than 168 hours.*start again from after=0/);
    // From the start: the oldest event within the age, found without scanning history.
    const fromStart = await client.events.list({ subject });
    expect(fromStart.items.map((e) => e.seq)).toEqual(seqs.slice(20));
    const recent = await client.events.list({ subject, after: seqs[21]! });
    expect(recent.items.map((e) => e.seq)).toEqual(seqs.slice(22));

    // Near enough to the newest for the count, but too old.
    const stream = await openStream(reader.token, { 'last-event-id': String(seqs[15]!) });
    expect(stream.status).toBe(400);
    expect(stream.body!.error.message).toMatch(/older than 168 hours.*or reconnect without Last-Event-ID/);
  });
});
