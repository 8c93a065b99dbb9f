import type { OutboxCursor, OutboxEvent, OutboxFilter } from '../db/events/outbox-read.ts';

// Reading the outbox is db/events/outbox-read.ts; these are its in-memory twins, for the hub.

/** Whether an event type matches a list of exact types or `prefix.*` patterns (empty: all). */
export function typeMatches(patterns: readonly string[], type: string): boolean {
  if (patterns.length === 0) return true;
  return patterns.some((p) => (p.endsWith('*') ? type.startsWith(p.slice(0, -1)) : p === type));
}

/** Orders two outbox positions: negative, zero or positive. */
export function compareCursors(a: OutboxCursor, b: OutboxCursor): number {
  const ax = BigInt(a.xid);
  const bx = BigInt(b.xid);
  if (ax !== bx) return ax < bx ? -1 : 1;
  return a.seq - b.seq;
}

/** Whether an event passes a filter (the in-memory twin of readOutbox's WHERE clause). */
export function eventMatches(event: OutboxEvent, filter: OutboxFilter): boolean {
  if (filter.tenantId !== null && event.tenantId !== filter.tenantId) return false;
  if (filter.subject !== undefined && event.subject !== filter.subject) return false;
  return typeMatches(filter.types ?? [], event.type);
}
