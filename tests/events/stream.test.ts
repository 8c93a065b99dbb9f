import { describe, expect, test } from 'vitest';
import { ComputeClientError, type ComputeEvent, createComputeClient, parseSse } from '../../client/index.ts';
import { outboxStart, readOutbox } from '../../db/events/outbox-read.ts';
import { newId } from '../../domain/ids.ts';
import { useTestApi } from '../support/api.ts';
import { insertOutboxEvent, untilReadable } from '../support/events.ts';
import { tenantMember } from '../support/iam.ts';

const api = useTestApi();

const emit = (type: string, subject: string, tenantId: string | null = 'acme') =>
  insertOutboxEvent(api.database.db, { type, subject, tenantId, data: { type } });

/** Reads `count` event frames from a raw SSE connection, then drops it. */
async function readFrames(headers: Record<string, string>, query: string, count: number) {
  const controller = new AbortController();
  const response = await fetch(`${api.url}/api/compute/events/stream${query}`, {
    headers: { authorization: `Bearer ${api.acme.token}`, ...headers },
    signal: controller.signal,
  });
  expect(response.status).toBe(200);
  expect(response.headers.get('content-type')).toContain('text/event-stream');
  const frames: Array<{ id: string | undefined; event: string; data: string }> = [];
  for await (const frame of parseSse(response.body!)) {
    frames.push(frame);
    if (frames.filter((f) => f.event !== 'ready').length >= count) break;
  }
  controller.abort();
  return frames;
}

describe('events.list', () => {
  test('pages a subject’s history by seq, only within the caller’s tenant', async () => {
    const subject = `reservation/${newId('rsv')}`;
    const ids: string[] = [];
    for (const type of ['reservation.placed', 'reservation.binding', 'reservation.active'])
      ids.push(await emit(type, subject));
    ids.push(await emit('reservation.placed', subject, 'globex'));
    await untilReadable(api.database.db, ids);
    const client = createComputeClient({ baseURL: api.url, token: api.acme.token });
    const first = await client.events.list({ subject, limit: 2 });
    expect(first.items.map((e) => e.type)).toEqual(['reservation.placed', 'reservation.binding']);
    expect(first.next).toBe(first.items[1]!.seq);
    const second = await client.events.list({ subject, limit: 2, after: first.next! });
    expect(second.items.map((e) => e.type)).toEqual(['reservation.active']);
    expect(second.next).toBeNull();
    expect(second.items[0]).toMatchObject({
      subject,
      tenantId: 'acme',
      data: { type: 'reservation.active' },
    });

    const onlyActive = await client.events.list({ subject, types: ['reservation.active'] });
    expect(onlyActive.items).toHaveLength(1);

    const error = await client.events.list({ tenantId: 'globex' }).catch((e: unknown) => e);
    expect(error).toBeInstanceOf(ComputeClientError);
    expect((error as ComputeClientError).code).toBe('ACCESS_DENIED');
    const bad = await client.events.list({ limit: 0 }).catch((e: unknown) => e);
    expect((bad as ComputeClientError).code).toBe('INVALID_INPUT');
  });
});

describe('events.list for the platform', () => {
  test('a platform administrator reads every tenant’s events and the fleet’s own; a member only their tenant’s', async () => {
    const subject = `node/${newId('node')}`;
    const ids = [
      await emit('node.cordoned', subject, null),
      await emit('reservation.placed', `reservation/${newId('rsv')}`, 'globex'),
    ];
    await untilReadable(api.database.db, ids);
    const root = createComputeClient({ baseURL: api.url, token: api.root.token });
    const all = await root.events.list({ limit: 500 });
    expect(all.items.some((e) => e.subject === subject && e.tenantId === null)).toBe(true);
    expect(all.items.some((e) => e.tenantId === 'globex')).toBe(true);
    const onlyGlobex = await root.events.list({ tenantId: 'globex', limit: 500 });
    expect(onlyGlobex.items.every((e) => e.tenantId === 'globex')).toBe(true);
    const member = createComputeClient({ baseURL: api.url, token: api.acme.token });
    const mine = await member.events.list({ limit: 500 });
    expect(mine.items.every((e) => e.tenantId === 'acme')).toBe(true);
  });
});

describe('the event stream', () => {
  test('resumes from Last-Event-ID after a reconnect without losing or repeating an event', async () => {
    const subject = `reservation/${newId('rsv')}`;
    const query = `?subject=${encodeURIComponent(subject)}`;
    const emitted: string[] = [];
    for (let i = 0; i < 3; i++) emitted.push(await emit(`test.step-${i}`, subject));

    // Read two of the three from the start, then drop the connection.
    const first = await readFrames({}, `${query}&after=0`, 2);
    const firstEvents = first.filter((f) => f.event !== 'ready');
    expect(firstEvents.map((f) => JSON.parse(f.data).id)).toEqual(emitted.slice(0, 2));
    const lastId = firstEvents.at(-1)!.id!;

    // While disconnected, more happens (including in other subjects and tenants).
    emitted.push(await emit('test.step-3', subject));
    await emit('test.elsewhere', `reservation/${newId('rsv')}`);
    await emit('test.other-tenant', subject, 'globex');
    emitted.push(await emit('test.step-4', subject));

    const second = await readFrames({ 'last-event-id': lastId }, query, 3);
    const secondEvents = second.filter((f) => f.event !== 'ready');
    expect(secondEvents.map((f) => JSON.parse(f.data).id)).toEqual(emitted.slice(2));
    expect(secondEvents.map((f) => f.event)).toEqual(['test.step-2', 'test.step-3', 'test.step-4']);
    // Every frame's id is its seq, so a browser's EventSource resumes the same way.
    for (const frame of secondEvents) expect(frame.id).toBe(String(JSON.parse(frame.data).seq));
  });

  test('the typed client follows the stream live and stops on abort', async () => {
    const subject = `reservation/${newId('rsv')}`;
    const client = createComputeClient({ baseURL: api.url, token: api.acme.token });
    const controller = new AbortController();
    const seen: ComputeEvent[] = [];
    let onReady!: () => void;
    const ready = new Promise<void>((resolve) => {
      onReady = resolve;
    });
    const reading = (async () => {
      for await (const event of client.$stream({ subject, signal: controller.signal, onReady })) {
        seen.push(event);
        if (seen.length === 2) controller.abort();
      }
    })();
    await ready;
    await emit('reservation.binding', subject);
    await emit('reservation.active', subject);
    await reading;
    expect(seen.map((e) => e.type)).toEqual(['reservation.binding', 'reservation.active']);
  });

  test('the typed client reconnects by itself after a dropped connection and resumes exactly', async () => {
    const subject = `reservation/${newId('rsv')}`;
    let connections = 0;
    // The first connection is cut right after its first event frame, as a proxy timing out would.
    const droppingFetch: typeof fetch = async (input, init) => {
      const response = await fetch(input, init);
      if (!String(input).includes('/events/stream') || connections++ > 0) return response;
      let text = '';
      const cut = new TransformStream<Uint8Array, Uint8Array>({
        transform(chunk, controller) {
          text += new TextDecoder().decode(chunk);
          const start = text.indexOf('\nevent: test.');
          const end = start === -1 ? -1 : text.indexOf('\n\n', start);
          if (end === -1) return;
          controller.enqueue(new TextEncoder().encode(text.slice(0, end + 2)));
          controller.error(new Error('connection reset'));
        },
      });
      return new Response(response.body!.pipeThrough(cut), {
        status: response.status,
        headers: response.headers,
      });
    };
    const client = createComputeClient({ baseURL: api.url, token: api.acme.token, fetch: droppingFetch });
    const ids: string[] = [];
    for (let i = 0; i < 4; i++) ids.push(await emit(`test.n${i}`, subject));
    const controller = new AbortController();
    const seen: string[] = [];
    for await (const event of client.$stream({ subject, after: 0, signal: controller.signal })) {
      seen.push(event.id);
      if (seen.length === 4) controller.abort();
    }
    expect(connections).toBeGreaterThanOrEqual(2);
    expect(seen).toEqual(ids);
  });

  test('many concurrent streams, live and resuming, each get exactly their events while writers race', async () => {
    const subjects = [0, 1, 2].map(() => `reservation/${newId('rsv')}`);
    const before = await Promise.all(subjects.map((subject) => emit('test.before', subject)));
    // A stream from now starts at the horizon of transactions in flight: until every older
    // transaction of the cluster (another file's, say) has ended, a live stream would still get
    // the events written before it. Wait until they are past it, so "before" means before.
    await expect
      .poll(
        async () => {
          const listed = await readOutbox(
            api.database.db,
            outboxStart,
            { tenantId: 'acme', types: ['test.before'] },
            1000,
          );
          return before.every((id) => listed.events.some((e) => e.id === id));
        },
        { timeout: 30_000, interval: 100 },
      )
      .toBe(true);
    // One token per subject: a token holds at most BETTER_COMPUTE_EVENT_STREAMS_PER_TOKEN (8) streams.
    const clients = await Promise.all(
      subjects.map(async (_, s) => {
        const { token } = await tenantMember(api.iam, 'acme', { name: `acme-reader-${s}` });
        return createComputeClient({ baseURL: api.url, token });
      }),
    );
    const controller = new AbortController();
    const expected = 1 + 10; // one before (seen by the resuming streams only), ten during
    const opened: Promise<unknown>[] = [];
    const readers = subjects.flatMap((subject, s) =>
      [0, 1, 2, 3].map(async (r) => {
        const resuming = r % 2 === 0;
        const seen: string[] = [];
        let onReady!: () => void;
        opened.push(
          new Promise<void>((resolve) => {
            onReady = resolve;
          }),
        );
        for await (const event of clients[s]!.$stream({
          subject,
          ...(resuming ? { after: 0 } : {}),
          signal: controller.signal,
          onReady,
        })) {
          seen.push(event.id);
          if (seen.length === (resuming ? expected : expected - 1)) break;
        }
        return { s, resuming, seen };
      }),
    );
    // Every stream is open (the server has sent its ready frame) before the writers start.
    await Promise.all(opened);
    // Ten events per subject, written by concurrent transactions.
    const during = await Promise.all(
      subjects.map(async (subject) => {
        const ids: string[] = [];
        await Promise.all(
          Array.from({ length: 10 }, async () => {
            ids.push(await emit('test.during', subject));
          }),
        );
        return ids;
      }),
    );
    const results = await Promise.race([
      Promise.all(readers),
      new Promise<never>((_, reject) =>
        setTimeout(() => reject(new Error('streams did not finish')), 45_000),
      ),
    ]);
    controller.abort();
    for (const { s, resuming, seen } of results) {
      const want = resuming ? [before[s]!, ...during[s]!] : during[s]!;
      expect(new Set(seen).size).toBe(seen.length);
      expect([...seen].sort()).toEqual([...want].sort());
    }
  }, 120_000);

  test('refuses a missing credential with the API envelope and a malformed Last-Event-ID', async () => {
    const anonymous = await fetch(`${api.url}/api/compute/events/stream`);
    expect(anonymous.status).toBe(401);
    expect(((await anonymous.json()) as { error: { code: string } }).error.code).toBe('UNAUTHENTICATED');
    const bad = await fetch(`${api.url}/api/compute/events/stream`, {
      headers: { authorization: `Bearer ${api.acme.token}`, 'last-event-id': 'yesterday' },
    });
    expect(bad.status).toBe(400);
    const client = createComputeClient({ baseURL: api.url, token: 'bct_wrong' });
    const error = await (async () => {
      for await (const _ of client.$stream({})) return null;
    })().catch((e: unknown) => e);
    expect((error as ComputeClientError).code).toBe('UNAUTHENTICATED');
  });
});
