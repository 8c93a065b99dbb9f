import { createHash } from 'node:crypto';
import { encodeTime } from 'ulid';

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
  | 'st'
  | 'dt'
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

const crockford = '0123456789abcdefghjkmnpqrstvwxyz';

/** Random bytes drawn 256 ids at a time: a draw of Web Crypto costs far more than the bytes it returns. */
const randomPool = new Uint8Array(10 * 256);
let randomAt = randomPool.length;

/** The next 10 random bytes of the pool, as a view (read before the next call). */
function tenRandomBytes(): Uint8Array {
  if (randomAt === randomPool.length) {
    crypto.getRandomValues(randomPool);
    randomAt = 0;
  }
  randomAt += 10;
  return randomPool.subarray(randomAt - 10, randomAt);
}

/**
 * A new time-ordered id with the given prefix (lower-case ULID, sortable by creation): the time
 * part from `ulid`'s encoder, the 80 random bits from a pool of Web Crypto bytes (the `ulid`
 * package's default looks its generator up and draws one byte per character on every id: about
 * 25 times the CPU; a draw of 10 bytes for each id was still 3 % of the API's CPU under load).
 * Ids are names, not secrets: tokens draw their own bytes.
 */
export function newId(prefix: IdPrefix): string {
  const bytes = tenRandomBytes();
  let random = '';
  for (let i = 0; i < 10; i += 5) {
    // 5 bytes = 40 bits = 8 characters of 5 bits.
    const hi = (bytes[i]! << 12) | (bytes[i + 1]! << 4) | (bytes[i + 2]! >>> 4);
    const lo = ((bytes[i + 2]! & 15) << 16) | (bytes[i + 3]! << 8) | bytes[i + 4]!;
    for (let shift = 15; shift >= 0; shift -= 5) random += crockford[(hi >>> shift) & 31];
    for (let shift = 15; shift >= 0; shift -= 5) random += crockford[(lo >>> shift) & 31];
  }
  return `${prefix}_${encodeTime(Date.now(), 10).toLowerCase()}${random}`;
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
