import { createHash } from 'node:crypto';
import { ulid } from 'ulid';

/** Prefixes of every id the control plane mints; ids read as `pool_01k…`. */
export type IdPrefix =
  | 'site'
  | 'pool'
  | 'node'
  | 'dev'
  | 'alloc'
  | 'rsv'
  | 'cmd'
  | 'jt'
  | 'cert'
  | 'evt'
  | 'hold'
  | 'inst'
  | 'img'
  | 'prof'
  | 'rel'
  | 'roll'
  | 'tnt'
  | 'idn'
  | 'tok'
  | 'role'
  | 'pol'
  | 'cnf'
  | 'req'
  | 'proj'
  | 'hook'
  | 'wf';

/** A new time-ordered id with the given prefix (lower-case ULID, sortable by creation). */
export function newId(prefix: IdPrefix): string {
  return `${prefix}_${ulid().toLowerCase()}`;
}

const base32Alphabet = 'abcdefghijklmnopqrstuvwxyz234567';

/** RFC 4648 base32 in lower case without padding. */
export function base32(bytes: Uint8Array): string {
  let out = '';
  let buffer = 0;
  let bits = 0;
  for (const byte of bytes) {
    buffer = (buffer << 8) | byte;
    bits += 8;
    while (bits >= 5) {
      out += base32Alphabet[(buffer >>> (bits - 5)) & 31];
      bits -= 5;
    }
  }
  if (bits > 0) out += base32Alphabet[(buffer << (5 - bits)) & 31];
  return out;
}

/**
 * The deterministic draft id of a reservation: `rsv_` + base32 SHA-256 of tenant, caller identity
 * and idempotency key. The same key from another identity reaches a row of its own.
 */
export function reservationDraftId(tenantId: string, identityId: string, idempotencyKey: string): string {
  const digest = createHash('sha256')
    .update(JSON.stringify([tenantId, identityId, idempotencyKey]))
    .digest();
  return `rsv_${base32(digest)}`;
}
