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
  'reservation.queued',
  'reservation.placed',
  'reservation.binding',
  'reservation.binding-rejected',
  'reservation.binding-restored',
  'reservation.conditions-changed',
  'reservation.member-replaced',
  'reservation.active',
  'reservation.extended',
  'reservation.repaired',
  'reservation.repair-failed',
  'reservation.releasing',
  'reservation.release-forced',
  'reservation.released',
  'reservation.cancelled',
  'reservation.failed',
  'reservation.expired',
  'reservation.denied',
  'reservation.signal-refused',
  'reservation.preempting',
  'reservation.preempted',
  'reservation.preemption-called-off',
  'reservation.machine-freed',
  'node.cordoned',
  'node.uncordoned',
  'node.draining',
  'node.drained',
  'node.tainted',
  'node.untainted',
  'node.command-queued',
  'node.maintenance-set',
  'node.maintenance-cleared',
  'node.provision-state-changed',
  'hold.created',
  'hold.released',
  'hold.expired',
  'metal.workflow-started',
  'metal.workflow-step-finished',
  'metal.workflow-succeeded',
  'metal.workflow-failed',
  'metal.workflow-aborted',
  'metal.workflow-retried',
  'release.published',
  'rollout.created',
  'rollout.wave-started',
  'rollout.node-updating',
  'rollout.node-updated',
  'rollout.node-failed',
  'rollout.node-skipped',
  'rollout.node-rolling-back',
  'rollout.node-rolled-back',
  'rollout.paused',
  'rollout.resumed',
  'rollout.aborted',
  'rollout.completed',
  'rollout.rolled-back',
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
