import { confirmationMethods } from './admin/confirmations.ts';
import { adminMethods } from './admin/index.ts';
import { capacityMethods } from './capacity.ts';
import { eventMethods } from './events.ts';
import { joinTokenMethods } from './join-tokens.ts';
import type { MethodRegistry } from './method.ts';
import { nodeCapacityMethods } from './node-capacity.ts';
import { nodeMethods } from './nodes.ts';
import { reservationMethods } from './reservations/index.ts';
import { systemMethods } from './system.ts';
import { webhookMethods } from './webhooks.ts';

/**
 * Every API group, in one registry: the Hono routes, `compute.api`, the typed client and the
 * OpenAPI document are all derived from it. Add a group by importing its file here.
 */
export const methods = {
  system: systemMethods,
  events: eventMethods,
  webhooks: webhookMethods,
  admin: adminMethods,
  confirmations: confirmationMethods,
  reservations: reservationMethods,
  capacity: { ...capacityMethods, ...nodeCapacityMethods },
  nodes: nodeMethods,
  joinTokens: joinTokenMethods,
} satisfies MethodRegistry;

export type Methods = typeof methods;
