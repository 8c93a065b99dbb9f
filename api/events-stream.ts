import type { Hono } from 'hono';
import { type SSEStreamingApi, streamSSE } from 'hono/streaming';
import type { Deps } from '../core/deps.ts';
import { type OutboxCursor, outboxHead } from '../db/events/outbox-read.ts';
import { ComputeError } from '../domain/errors.ts';
import { createOutboxHub } from '../events/outbox-hub.ts';
import { replayStart, streamReplayWindow } from '../events/replay-window.ts';
import { createStreamSlots, type StreamLimits, streamLimitsFromConfig } from '../events/stream-slots.ts';
import { type Authenticator, bearerToken } from './authenticate.ts';
import type { ApiEnv } from './env.ts';
import { authorizeEventRead } from './events-access.ts';

export interface EventStreamOptions {
  /** How often a stream with nothing new reads the outbox again. */
  pollMs?: number;
  /** How often an idle stream sends a comment, so proxies keep it open. */
  keepAliveMs?: number;
  /** Open streams per token and per tenant; default from `deps.config` (`BETTER_COMPUTE_EVENT_STREAMS_*`). */
  limits?: StreamLimits;
}

/**
 * `GET /api/compute/events/stream[?subject=…&type=…&tenantId=…]`: server-sent events, one frame
 * per outbox event (`id` the seq, `event` the type, `data` the event as JSON). With
 * `Last-Event-ID` (or `?after=`) it resumes just after that event, so a reconnect loses and repeats
 * nothing; without it the stream starts at the current end. The first frame, `ready`, carries the
 * position it starts from as its id.
 *
 * Bounded: a token and a tenant hold at most `BETTER_COMPUTE_EVENT_STREAMS_PER_TOKEN` /
 * `…_PER_TENANT` open streams in this process (one more is RATE_LIMITED with retryAfterSeconds),
 * and a resume point more than `BETTER_COMPUTE_EVENT_STREAM_REPLAY_MAX_EVENTS` events behind, or
 * older than `BETTER_COMPUTE_EVENT_REPLAY_MAX_AGE_HOURS`, is INVALID_INPUT (events/replay-window.ts);
 * `after=0` starts at the oldest event still in that window.
 */
export function mountEventStream(
  app: Hono<ApiEnv>,
  context: { deps: Deps; authenticate: Authenticator },
  options: EventStreamOptions = {},
) {
  const { deps, authenticate } = context;
  const keepAliveMs = options.keepAliveMs ?? 15_000;
  const hub = createOutboxHub(deps, { pollMs: options.pollMs ?? 250 });
  const slots = createStreamSlots(options.limits ?? streamLimitsFromConfig(deps.config));
  const window = streamReplayWindow(deps.config);

  app.get('/api/compute/events/stream', async (c) => {
    const principal = await authenticate(bearerToken(c.req.header('authorization')));
    const requestId = c.get('requestId');
    const tenantParam = c.req.query('tenantId') || undefined;
    const subject = c.req.query('subject') || undefined;
    const types = c.req.queries('type') ?? [];
    const resumeFrom = c.req.header('last-event-id') ?? c.req.query('after');
    if (resumeFrom !== undefined && !/^\d{1,18}$/.test(resumeFrom)) {
      throw new ComputeError(
        'INVALID_INPUT',
        `Last-Event-ID must be the seq of an event, got '${resumeFrom}'`,
      );
    }
    const tenantId = await authorizeEventRead(deps, principal, tenantParam, requestId);
    const cursor: OutboxCursor =
      resumeFrom === undefined
        ? await outboxHead(deps.db)
        : await replayStart(
            deps.db,
            Number(resumeFrom),
            window,
            c.req.header('last-event-id') !== undefined ? 'Last-Event-ID' : 'after',
          );
    const log = deps.log.child({ requestId, stream: 'events' });
    const signal = c.req.raw.signal;
    const release = slots.acquire(principal);

    c.header('cache-control', 'no-cache');
    c.header('x-accel-buffering', 'no');
    return streamSSE(
      c,
      async (stream) => {
        try {
          await follow(stream);
        } finally {
          release();
        }
      },
      async (error) => {
        release();
        log.warn({ err: error }, 'event stream ended with an error');
      },
    );

    async function follow(stream: SSEStreamingApi) {
      const closed = new AbortController();
      stream.onAbort(() => closed.abort());
      signal.addEventListener('abort', () => closed.abort(), { once: true });
      await stream.writeSSE({
        event: 'ready',
        id: String(cursor.seq),
        data: JSON.stringify({ seq: cursor.seq }),
      });
      const filter = { tenantId, subject, types };
      for await (const batch of hub.follow(cursor, filter, closed.signal, keepAliveMs)) {
        if (batch.length === 0) await stream.write(': keep-alive\n\n');
        for (const event of batch) {
          await stream.writeSSE({ id: String(event.seq), event: event.type, data: JSON.stringify(event) });
        }
      }
    }
  });
}
