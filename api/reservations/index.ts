import { create } from './create.ts';
import { cancel, release } from './end.ts';
import { extend, renew } from './extend.ts';
import { get, list } from './read.ts';

/** `reservations.*`: the seven methods of the reservations API. */
export const reservationMethods = { create, get, list, release, cancel, extend, renew };
