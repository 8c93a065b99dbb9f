import type { Config } from '../core/config.ts';
import type { Db } from '../core/database.ts';
import {
  cursorAfterSeq,
  type OutboxCursor,
  oldestSeqWithinAge,
  replayPosition,
} from '../db/events/outbox-read.ts';
import { ComputeError } from '../domain/errors.ts';

/** How far back a reader may start: by age (both doors), and by count (the stream only). */
export interface ReplayWindow {
  maxAgeHours: number;
  /** How many events behind the newest a resume point may be; absent: no count limit. */
  maxEvents?: number;
}

/** events.list pages back as far as the age allows. */
export function listReplayWindow(config: Config): ReplayWindow {
  return { maxAgeHours: config.BETTER_COMPUTE_EVENT_REPLAY_MAX_AGE_HOURS };
}

/** A stream replays at most the configured number of events, within the same age. */
export function streamReplayWindow(config: Config): ReplayWindow {
  return {
    maxAgeHours: config.BETTER_COMPUTE_EVENT_REPLAY_MAX_AGE_HOURS,
    maxEvents: config.BETTER_COMPUTE_EVENT_STREAM_REPLAY_MAX_EVENTS,
  };
}

/**
 * The cursor a reader starts after. `after` 0 is the oldest event still in the window (so reading
 * "from the start" never scans history older than it); any other seq is refused with INVALID_INPUT
 * when the events after it are older than the window's age, or (for a stream) when it is more than
 * `maxEvents` behind the newest event. `field` names the input in the message (`after`,
 * `Last-Event-ID`).
 */
export async function replayStart(
  db: Db,
  after: number,
  window: ReplayWindow,
  field: 'after' | 'Last-Event-ID',
): Promise<OutboxCursor> {
  if (after <= 0) {
    const withinAge = await oldestSeqWithinAge(db, window.maxAgeHours);
    if (withinAge !== null && window.maxEvents === undefined) return cursorAfterSeq(db, withinAge - 1);
    const { newestSeq } = await replayPosition(db, 0, window.maxAgeHours);
    // Nothing young enough: start at the newest, so only what comes next is read.
    let start = withinAge ?? newestSeq + 1;
    if (window.maxEvents !== undefined) start = Math.max(start, newestSeq - window.maxEvents + 1);
    return cursorAfterSeq(db, start - 1);
  }
  const position = await replayPosition(db, after, window.maxAgeHours);
  const behind = position.newestSeq - after;
  if (window.maxEvents !== undefined && behind > window.maxEvents) {
    throw new ComputeError(
      'INVALID_INPUT',
      `${field} ${after} is ${behind} events behind the newest, and a stream replays at most ${window.maxEvents}: read what was missed with events.list pages (after=${after}) and resume the stream from the last seq read, or reconnect without ${field} to follow from the newest event`,
      { field, behind, maxEvents: window.maxEvents },
    );
  }
  if (position.firstAfterTooOld) {
    throw new ComputeError(
      'INVALID_INPUT',
      `${field} ${after} is older than ${window.maxAgeHours} hours, the most events are replayed: start again from after=0 (the oldest event still kept for replay)${field === 'Last-Event-ID' ? ', or reconnect without Last-Event-ID to follow from the newest event' : ''}`,
      { field, maxAgeHours: window.maxAgeHours },
    );
  }
  return cursorAfterSeq(db, after);
}
