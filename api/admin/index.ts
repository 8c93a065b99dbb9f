import { adminDirectoryMethods } from './directory.ts';
import { adminFleetMethods } from './fleet.ts';
import { adminPoolMethods } from './pools.ts';

/** `admin.*`: the root tenant's administration of IAM (tenants, identities, tokens, roles, policies) and the fleet. */
export const adminMethods = { ...adminDirectoryMethods, ...adminFleetMethods, ...adminPoolMethods };
