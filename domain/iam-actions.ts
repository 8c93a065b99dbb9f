/**
 * The one closed table of IAM actions compute decides on: each resource type and its actions. An
 * action is `compute:<resource>:<verb>`; a method definition, the IAM port and every decision name
 * one from here, so an action outside the table does not type-check. Roles and policies, which
 * are data, grant them by pattern (`compute:*`, `compute:reservations:*` or an exact action).
 */
export const iamActionTable = {
  reservations: ['create', 'read', 'extend', 'release'],
  capacity: ['read', 'hold'],
  pools: ['read', 'declare-kinds'],
  nodes: [
    'read',
    'join',
    'command',
    'cordon',
    'uncordon',
    'drain',
    'taint',
    'retire',
    'revoke-certificates',
    'approve-reclaim',
    'maintenance',
    'provision',
    'configure',
  ],
  images: ['read', 'manage'],
  profiles: ['read', 'manage'],
  events: ['read'],
  webhooks: ['read', 'manage'],
  admin: ['read', 'write'],
} as const;

export type IamResource = keyof typeof iamActionTable;

export type IamAction = {
  [R in IamResource]: `compute:${R}:${(typeof iamActionTable)[R][number]}`;
}[IamResource];
