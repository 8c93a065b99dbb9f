import { z } from 'zod';
import type { TerminalState } from './reservation-states.ts';

/**
 * The one closed list of the event types compute writes to the outbox. The outbox writer takes
 * only these, webhook subscriptions name them (or a family's `prefix.*`), the OpenAPI document
 * lists them, and the client names its events' type from here.
 */
export const eventTypes = [
  'reservation.awaiting-confirmation',
  'reservation.pending',
  'reservation.placed',
  'reservation.binding',
  'reservation.binding-rejected',
  'reservation.active',
  'reservation.extended',
  'reservation.released',
  'reservation.cancelled',
  'reservation.failed',
  'reservation.expired',
  'reservation.denied',
  'node.cordoned',
  'node.uncordoned',
  'node.draining',
  'node.command-queued',
] as const;

export type EventType = (typeof eventTypes)[number];

/** What an event is about: the part of its type before the first dot (`reservation`, `node`). */
export type EventFamily = EventType extends `${infer Family}.${string}` ? Family : never;

/** Every type of a family at once (`reservation.*`), as subscriptions and filters may name it. */
export type EventFamilyPattern = `${EventFamily}.*`;

export const eventFamilyPatterns = [
  ...new Set(eventTypes.map((type) => `${type.slice(0, type.indexOf('.'))}.*` as EventFamilyPattern)),
];

/** An event type or a family's `prefix.*`: what a webhook subscription may name. */
export const eventTypePattern = z.enum([...eventTypes, ...eventFamilyPatterns]);

export type EventTypePattern = z.infer<typeof eventTypePattern>;

/** The event a lifecycle's `end` writes for the terminal state it leaves. */
export const terminalEventTypes = {
  released: 'reservation.released',
  cancelled: 'reservation.cancelled',
  failed: 'reservation.failed',
  expired: 'reservation.expired',
  denied: 'reservation.denied',
} as const satisfies Record<TerminalState, EventType>;
