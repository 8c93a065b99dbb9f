import { confirmationMethods } from './admin/confirmations.ts';
import { adminMethods } from './admin/index.ts';
import { capacityMethods } from './capacity.ts';
import { capacityDemandMethods } from './capacity-demand.ts';
import { eventMethods } from './events.ts';
import { holdMethods } from './holds/index.ts';
import { joinTokenMethods } from './join-tokens.ts';
import { imageMethods } from './metal/images.ts';
import { metalMethods } from './metal/machines.ts';
import { profileMethods } from './metal/profiles.ts';
import { workflowMethods } from './metal/provisioning.ts';
import { siteMethods } from './metal/sites.ts';
import type { MethodRegistry } from './method.ts';
import { nodeCapacityMethods } from './node-capacity.ts';
import { nodeMethods } from './nodes.ts';
import { releaseMethods } from './releases.ts';
import { reservationMethods } from './reservations/index.ts';
import { rolloutMethods } from './rollouts.ts';
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
  capacity: { ...capacityMethods, ...nodeCapacityMethods, ...capacityDemandMethods },
  holds: holdMethods,
  nodes: nodeMethods,
  joinTokens: joinTokenMethods,
  releases: releaseMethods,
  rollouts: rolloutMethods,
  sites: siteMethods,
  metal: metalMethods,
  images: imageMethods,
  profiles: profileMethods,
  workflows: workflowMethods,
} satisfies MethodRegistry;

export type Methods = typeof methods;
