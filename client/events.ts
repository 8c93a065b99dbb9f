import type { EventType } from '../domain/event-types.ts';
import { ComputeConnectionError } from './errors.ts';
import { parseSse } from './sse.ts';
import { apiUrl, resolveToken, type TokenSource } from './transport.ts';

/** One outbox event as every door shows it (events.list, the stream, webhooks). */
export interface ComputeEvent {
  /** `evt_…`, unique. */
  id: string;
  /** The outbox position: strictly increasing, the stream's resume point. */
  seq: number;
  /** One of the closed list of event types (domain/event-types.ts). */
  type: EventType;
  /** What the event is about: `reservation/rsv_…`, `node/node_…`. */
  subject: string;
  tenantId: string | null;
  data: Record<string, unknown>;
  /** Epoch milliseconds. */
  createdAt: number;
}

export interface StreamOptions {
  /** Only events of this subject (`reservation/rsv_…`). */
  subject?: string;
  /** Only events of these types (`reservation.active`). */
  types?: string[];
  /** Resume after this seq (the last event seen); without it the stream starts at "now". */
  after?: number;
  /** Stops the stream; the iterator then ends without an error. */
  signal?: AbortSignal;
  /** Reconnect after a dropped connection (default true), resuming from the last event seen. */
  reconnect?: boolean;
  /**
   * Called each time the server has opened the stream (its `ready` frame), with the position it
   * starts from: from then on every event written is delivered, so a caller can wait for it
   * before it writes what it wants to see.
   */
  onReady?: (position: number | undefined) => void;
}

interface StreamDeps {
  baseURL: string;
  token: TokenSource | undefined;
  fetch: typeof fetch;
  /** Turns a non-2xx answer with the API envelope into its typed error. */
  toError(response: Response, method: string): Promise<Error>;
}

function wait(ms: number, signal: AbortSignal | undefined): Promise<void> {
  return new Promise((resolve) => {
    const timer = setTimeout(resolve, ms);
    signal?.addEventListener(
      'abort',
      () => {
        clearTimeout(timer);
        resolve();
      },
      { once: true },
    );
  });
}

/**
 * Follows `GET /api/compute/events/stream` as an async iterator. After a dropped connection it
 * reconnects with `Last-Event-ID` set to the last seq it yielded, so no event is lost or repeated.
 * An answer with the API's error envelope (UNAUTHENTICATED, ACCESS_DENIED, …) ends it with that error.
 */
export async function* streamEvents(
  deps: StreamDeps,
  options: StreamOptions = {},
): AsyncGenerator<ComputeEvent> {
  const { signal } = options;
  let lastSeq = options.after;
  let failures = 0;
  const query = new URLSearchParams();
  if (options.subject) query.set('subject', options.subject);
  for (const type of options.types ?? []) query.append('type', type);
  const url = apiUrl(deps.baseURL, `/api/compute/events/stream${query.size ? `?${query}` : ''}`);
  while (!signal?.aborted) {
    const headers: Record<string, string> = { accept: 'text/event-stream' };
    const token = await resolveToken(deps.token);
    if (token) headers.authorization = `Bearer ${token}`;
    if (lastSeq !== undefined) headers['last-event-id'] = String(lastSeq);
    let response: Response;
    try {
      response = await deps.fetch(url, { headers, ...(signal ? { signal } : {}) });
    } catch (cause) {
      if (signal?.aborted) return;
      if (options.reconnect === false || ++failures > 5) {
        throw new ComputeConnectionError(`cannot reach the API at ${deps.baseURL}`, { url, cause });
      }
      await wait(Math.min(250 * 2 ** failures, 5000), signal);
      continue;
    }
    if (!response.ok || !response.body) throw await deps.toError(response, 'events.stream');
    failures = 0;
    try {
      for await (const frame of parseSse(response.body)) {
        if (frame.event === 'ready') {
          // The position the server starts from: a reconnect before any event resumes there.
          if (lastSeq === undefined && frame.id) lastSeq = Number(frame.id);
          options.onReady?.(frame.id ? Number(frame.id) : undefined);
          continue;
        }
        const event = JSON.parse(frame.data) as ComputeEvent;
        lastSeq = event.seq;
        yield event;
      }
    } catch (error) {
      if (signal?.aborted) return;
      if (options.reconnect === false) throw error;
    }
    if (options.reconnect === false) return;
    await wait(250, signal);
  }
}
