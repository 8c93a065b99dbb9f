import { z } from 'zod';
import { readOutbox } from '../db/events/outbox-read.ts';
import { listReplayWindow, replayStart } from '../events/replay-window.ts';
import { authorizeEventRead, eventsReadAction } from './events-access.ts';
import { defineMethod } from './method.ts';

/** One outbox event, as events.list, the stream and webhooks show it. */
export const eventSchema = z.object({
  id: z.string(),
  seq: z.number().int(),
  type: z.string(),
  subject: z.string(),
  tenantId: z.string().nullable(),
  data: z.record(z.string(), z.unknown()),
  createdAt: z.number().int(),
});

const typePattern = z
  .string()
  .regex(
    /^[a-z][a-z0-9-]*(\.[a-z0-9-]+)*(\.\*)?$/,
    'an event type such as reservation.active, or reservation.*',
  );

const list = defineMethod({
  summary:
    'Event history by subject and type, oldest first, paged: pass the last seq as `after` (next) to read on. Events appear once their transaction has committed and every older one has too. History reaches back BETTER_COMPUTE_EVENT_REPLAY_MAX_AGE_HOURS (default 7 days): `after` 0 starts at the oldest event within it, and an older `after` is INVALID_INPUT.',
  action: eventsReadAction,
  input: z.strictObject({
    tenantId: z.string().min(1).optional(),
    subject: z.string().min(1).max(300).optional(),
    types: z.array(typePattern).max(50).optional(),
    after: z.number().int().min(0).default(0),
    limit: z.number().int().min(1).max(500).default(100),
  }),
  output: z.object({
    items: z.array(eventSchema),
    /** The `after` of the next page, or null when this page reached the end for now. */
    next: z.number().int().nullable(),
  }),
  handler: async ({ deps, principal, requestId }, input) => {
    const tenantId = await authorizeEventRead(deps, principal, input.tenantId, requestId);
    const cursor = await replayStart(deps.db, input.after, listReplayWindow(deps.config), 'after');
    const page = await readOutbox(
      deps.db,
      cursor,
      { tenantId, subject: input.subject, types: input.types },
      input.limit,
    );
    return {
      items: page.events,
      next: page.events.length === input.limit ? page.cursor.seq : null,
    };
  },
});

export const eventMethods = { list };
